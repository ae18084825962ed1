"""The image processor of a model config: the pretrained model's own, or one built from ``model.processor`` and its config."""


def image_geometry(model) -> tuple[int, int]:
    """(image_size, num_channels) the model takes."""
    return int(model.config.image_size), int(model.config.num_channels)


def image_tokens(model) -> int:
    """Tokens the encoder sees per image: its patches plus CLS (and DeiT's distillation token), by running its embeddings."""
    import torch

    size, channels = image_geometry(model)
    device = next(model.parameters()).device
    with torch.no_grad():
        return int(model.base_model.embeddings(torch.zeros(1, channels, size, size, device=device)).shape[1])


def own_length(model) -> tuple[int, str]:
    """(tokens per image, what they are): every image is its patches plus CLS (and DeiT's distillation token)."""
    tokens, patches = image_tokens(model), (int(model.config.image_size) // int(model.config.patch_size)) ** 2
    extra = {1: "CLS", 2: "CLS + distillation"}.get(tokens - patches, f"{tokens - patches} special tokens")
    return tokens, f"the model's own tokens per image: {patches} patches + {extra}"


def build_processor(model_cfg, model):
    """``AutoImageProcessor`` of ``model.pretrained``, else a ViT processor sized to the model with ``model.processor``'s mean/std."""
    from transformers import AutoImageProcessor, ViTImageProcessorPil

    from headprune.models.sources import resolve_pretrained

    if model_cfg.get("pretrained"):
        return AutoImageProcessor.from_pretrained(resolve_pretrained(model_cfg.pretrained))
    settings = model_cfg.get("processor")
    if not settings:
        raise ValueError(f"model {model_cfg.get('name')!r} is built fresh but sets no model.processor: give it image_mean and image_std")
    size, _ = image_geometry(model)
    return ViTImageProcessorPil(
        size={"height": size, "width": size}, image_mean=list(settings.image_mean), image_std=list(settings.image_std)
    )
