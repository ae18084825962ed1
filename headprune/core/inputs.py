"""What a model's forward gets from a batch, and which of its positions are real."""

from contextlib import contextmanager

ENCODER_GROUPS = ("enc_self", "enc_ffn")  # the mask groups whose units sit at the encoder's positions
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what an encoder classifier's forward takes
DECODER_INPUTS = ("input_ids", "attention_mask")  # ... and a decoder-only LM's
NON_INPUTS = ("labels", "idx", "ids")  # batch keys the forward never gets: labels (we compute the loss), dataset bookkeeping


def model_inputs(model, batch: dict) -> dict:
    """The forward inputs of a batch: everything but ``labels``, so the model never computes its own loss."""
    inputs = {k: v for k, v in batch.items() if k not in NON_INPUTS}
    labels = batch.get("labels")
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if labels is not None and "decoder_input_ids" not in inputs and prepare is not None and labels.dim() == 2:
        inputs["decoder_input_ids"] = prepare(labels=labels)
    return inputs


def decoder_valid(batch: dict):
    """(B, T) mask of the real decoder positions of a batch (the input's own mask for decoder-only models)."""
    if "decoder_input_ids" not in batch:
        return batch.get("attention_mask")  # a decoder-only model: its input is the decoder's
    if batch.get("decoder_attention_mask") is not None:
        return batch["decoder_attention_mask"]
    labels = batch.get("labels")
    return (labels != -100).long() if labels is not None and labels.dim() == 2 else None


def group_valid(group: str, batch: dict):
    """(B, T) mask of the real tokens at a mask group's positions: the input's own for the encoder's groups, else the decoder's."""
    return batch.get("attention_mask") if group in ENCODER_GROUPS else decoder_valid(batch)


def valid_token_rows(x, batch: dict):
    """x (B, T, C) as its rows at the real (not padding) tokens (N, C); the batch's mask of the matching length decides."""
    rows = x.reshape(-1, x.shape[-1])
    for valid in (batch.get("attention_mask"), decoder_valid(batch)):
        if valid is not None and x.dim() == 3 and tuple(valid.shape) == tuple(x.shape[:2]):
            return rows[valid.to(x.device).reshape(-1).bool()]
    return rows


@contextmanager
def hooks_removed(handles: list):
    """Within the block the hooks of ``handles`` are on the model; they are removed after, whatever happens."""
    try:
        yield handles
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def eval_mode(model):
    """Within the block the model is in eval mode (no dropout); its own mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
