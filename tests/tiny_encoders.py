"""Tiny random models of the encoder and encoder-decoder families (DistilBERT, ViT, DeiT, T5, Whisper, DeBERTa-v2), with a batch each."""

from __future__ import annotations

import torch
from conftest import classifier_batch, seq2seq_batch

VOCAB = 50


def _seeded(seed: int, make):
    torch.manual_seed(seed)
    return make().float().eval()


def tiny_distilbert(seed: int = 0):
    """A random DistilBERT classifier: 3 layers x 4 heads of dim 8."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(vocab_size=VOCAB, dim=32, n_heads=4, n_layers=3, hidden_dim=64, num_labels=3, max_position_embeddings=64)
    return _seeded(seed, lambda: DistilBertForSequenceClassification(config))


def _image_config(config_class):
    return config_class(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=3, intermediate_size=64, image_size=16, patch_size=4, num_labels=3
    )


def tiny_vit(seed: int = 0):
    """A random ViT image classifier: 16x16 images in 4x4 patches, 3 layers x 4 heads."""
    from transformers import ViTConfig, ViTForImageClassification

    return _seeded(seed, lambda: ViTForImageClassification(_image_config(ViTConfig)))


def tiny_deit(seed: int = 0):
    """A random DeiT image classifier (with its distillation token), 3 layers x 4 heads."""
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    return _seeded(seed, lambda: DeiTForImageClassificationWithTeacher(_image_config(DeiTConfig)))


def tiny_t5(seed: int = 0, model_type: str = "t5"):
    """A random T5 (or mT5) translation model: 3+3 layers x 4 heads of dim 8, relative position bias in each stack's first layer."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4, relative_attention_num_buckets=8,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    return _seeded(seed, lambda: AutoModelForSeq2SeqLM.from_config(config))


def tiny_whisper(seed: int = 0):
    """A random Whisper speech-to-text model: 8 mel bins, 2+2 layers x 4 heads."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=8, max_target_positions=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=1, decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[],
    )  # fmt: skip
    return _seeded(seed, lambda: WhisperForConditionalGeneration(config))


def tiny_deberta_v2(seed: int = 0, share_att_key: bool = False):
    """A random DeBERTa-v2 classifier with relative attention (c2p and p2c; own position projections unless shared), 3 layers x 4 heads."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    config = DebertaV2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, num_labels=3,
        max_position_embeddings=64, relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8, share_att_key=share_att_key,
    )  # fmt: skip
    return _seeded(seed, lambda: DebertaV2ForSequenceClassification(config))


def image_batch(seed: int = 0, batch: int = 4):
    """Random 16x16 RGB images and class labels."""
    gen = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=gen), "labels": torch.randint(0, 3, (batch,), generator=gen)}


def speech_batch(seed: int = 0, batch: int = 3):
    """Random log-mel features (B, 8 bins, 16 frames) and labels with -100 padding, decoder inputs from the labels."""
    gen = torch.Generator().manual_seed(seed)
    labels = seq2seq_batch(seed, batch=batch, vocab=VOCAB)["labels"]
    start = torch.ones(batch, 1, dtype=torch.long)
    decoder_input_ids = torch.cat([start, labels[:, :-1].clamp(min=0)], 1)
    return {"input_features": torch.randn(batch, 8, 16, generator=gen), "decoder_input_ids": decoder_input_ids, "labels": labels}


def text_pair_batch(seed: int = 0):
    """Source ids with padding and labels with -100 padding (decoder inputs come from the labels)."""
    return seq2seq_batch(seed, vocab=VOCAB)


FAMILY_MODELS = {  # name: (tiny model, its batch)
    "distilbert": (tiny_distilbert, lambda: classifier_batch(vocab=VOCAB)),
    "vit": (tiny_vit, image_batch),
    "deit": (tiny_deit, image_batch),
    "t5": (tiny_t5, text_pair_batch),
    "mt5": (lambda seed=0: tiny_t5(seed, "mt5"), text_pair_batch),
    "whisper": (tiny_whisper, speech_batch),
    "deberta-v2": (tiny_deberta_v2, lambda: classifier_batch(vocab=VOCAB)),
    "deberta-v2 shared keys": (lambda seed=0: tiny_deberta_v2(seed, share_att_key=True), lambda: classifier_batch(vocab=VOCAB)),
}
