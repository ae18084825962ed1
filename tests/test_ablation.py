"""The batched multi-mask engine equals evaluating every mask on its own."""

import pytest
import torch
from mask_references import looped_mask_logits
from transformers import BertConfig, BertForSequenceClassification, RobertaConfig, RobertaForSequenceClassification

from headprune.core.attention.gates import HeadGates
from headprune.engine.ablation import MaskBatcher, keep_one_masks, single_unit_masks


def _tiny(kind: str, attn: str):
    torch.manual_seed(0)
    if kind == "bert":
        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, num_labels=3)
        model = BertForSequenceClassification(config)
    else:
        config = RobertaConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, num_labels=3, pad_token_id=1
        )
        model = RobertaForSequenceClassification(config)
    model.set_attn_implementation(attn)
    return model.eval()


def _batch():
    ids = torch.randint(2, 100, (5, 9))
    attention = torch.ones_like(ids)
    attention[1, 6:] = 0
    attention[3, 4:] = 0
    return {"input_ids": ids, "attention_mask": attention}


@pytest.mark.parametrize("kind,attn", [("bert", "sdpa"), ("bert", "eager"), ("roberta", "sdpa")])
def test_batched_equals_looped(kind, attn):
    model = _tiny(kind, attn)
    gates = HeadGates(model)
    batch = _batch()
    masks, heads = single_unit_masks(gates.groups)
    assert len(masks) == len(heads) == 12
    masks += keep_one_masks(gates.groups, "enc_self", 1) + [gates.ones()]
    mixed = gates.ones()
    mixed["enc_self"][1, :2] = 0
    mixed["enc_self"][2, 3] = 0
    masks.append(mixed)
    engine = MaskBatcher(model, gates, max_rows=20)  # small max_rows: several chunks
    batched = engine.logits(batch, masks)
    assert engine.first_token  # BERT and RoBERTa read only the first token: the cut last layer was used
    looped = looped_mask_logits(model, gates, batch, masks)
    torch.testing.assert_close(MaskBatcher(model, gates, first_token=False).logits(batch, masks), looped, atol=1e-5, rtol=1e-5)
    assert batched.shape == (len(masks), 5, 3)
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    # the engine leaves the model as it found it
    with torch.inference_mode():
        plain = model(**batch).logits
    torch.testing.assert_close(plain, looped[len(heads) + 4], atol=1e-6, rtol=1e-6)


def test_rejects_bad_masks():
    model = _tiny("bert", "sdpa")
    gates = HeadGates(model)
    with pytest.raises(ValueError):
        MaskBatcher(model, gates).logits(_batch(), [])
    with pytest.raises(ValueError):
        MaskBatcher(model, gates).logits(_batch(), [{"enc_self": torch.ones(2, 4)}])
