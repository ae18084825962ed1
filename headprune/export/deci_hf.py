"""vLLM ``DeciLMForCausalLM`` (Nemotron-NAS) checkpoints of pruned Llama-family decoders: per-layer KV heads and FFN widths."""

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.checks import ConfigError
from headprune.core.ffn.sites import find_ffn_sites
from headprune.export.gguf import layer_index
from headprune.export.hf import NOT_COPIED, check_phantoms, heads_per_kv, kept_per_kv, rope_and_bias_refusal
from headprune.export.tokenizer_files import save_tokenizer

DECI_TYPES = ("llama", "mistral")
CONFIG_MODULE = "configuration_decilm.py"  # the config class vLLM loads with trust_remote_code (auto_map)
AUTO_MAP = {"AutoConfig": "configuration_decilm.DeciLMConfig"}
RECORDS = "headprune_"  # the config fields of headprune's pruning records (heads, FFN widths, channels, layers): not written


@dataclass(frozen=True)
class LayerPlan:
    """One layer as written: its KV heads with the kept query heads of each (empty: no attention), and its FFN width."""

    groups: list[tuple[int, list[int]]]  # (original KV head, original ids of its kept query heads), in k/v weight order
    heads: int  # H: the query heads every attention of the file computes
    ffn_width: int  # neurons kept (0: no FFN)
    placeholder: bool = False  # a zero attention over one KV head, where vLLM needs an attention before the first FFN

    @property
    def kv_heads(self) -> int:
        return 1 if self.placeholder else len(self.groups)

    @property
    def has_attention(self) -> bool:
        return self.kv_heads > 0

    @property
    def n_heads_in_group(self) -> int | None:
        return self.heads // self.kv_heads if self.has_attention else None


def refusal(fields: dict) -> str | None:
    """Why export.format=deci_hf cannot write a model of these config fields (None when it can)."""
    model_type = fields.get("model_type")
    if model_type not in DECI_TYPES:
        return (
            f"export.format=deci_hf writes Llama and Mistral decoders ({', '.join(DECI_TYPES)}) as vLLM's DeciLMForCausalLM "
            f"(Nemotron-NAS: Llama layers with their own KV heads and FFN widths), not {model_type!r}: use export.format=onnx"
        )
    if layout := rope_and_bias_refusal(fields, "deci_hf", "export.format=onnx"):
        return layout
    if fields.get("hidden_act", "silu") != "silu":
        return f"export.format=deci_hf writes SiLU feed-forward blocks (vLLM's LlamaMLP), this model has {fields['hidden_act']}: use export.format=onnx"
    if model_type == "mistral" and fields.get("sliding_window") is not None:
        return "export.format=deci_hf has no sliding window (vLLM's nemotron_nas attends to every position): use export.format=onnx"
    return None


def kv_count_message(layer: int, kv: int, heads: int) -> str:
    """Why a layer keeping ``kv`` KV heads has no DeciLM form, and what works."""
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    return (
        f"export.format=deci_hf: layer {layer} keeps {kv} KV heads; vLLM's nemotron_nas runs num_attention_heads={heads} "
        f"query heads in every layer with attention, over {heads} / n_heads_in_group KV heads, so a layer keeps one of "
        f"{divisors} KV heads. Prune to such counts (e.g. prune.layout=uniform), or export with export.format=gguf (deci) "
        "or onnx, which take any count"
    )


def check_mask(fields: dict, rows: dict) -> None:
    """A ConfigError unless every layer of the query-head mask {group: [layers][heads]} keeps a KV-head count dividing H."""
    heads, per_kv = int(fields["num_attention_heads"]), heads_per_kv(fields)
    for layers in rows.values():
        for layer, row in enumerate(layers):
            kv = sum(map(bool, kept_per_kv(row, per_kv)))  # KV heads kept
            if kv and heads % kv:
                raise ConfigError(kv_count_message(layer, kv, heads))


def layer_plans(model: nn.Module) -> list[LayerPlan]:
    """The layers of a physically pruned model as the file writes them (see the module doc), or a ConfigError."""
    sites = sorted(find_sites(model), key=lambda s: s.layer)
    widths = {site.layer: site.width for site in find_ffn_sites(model)}
    plans = []
    for site in sites:
        served = {site.kv_of(h) for h in site.head_ids}
        groups = [(kv, [h for h in site.head_ids if site.kv_of(h) == kv]) for kv in site.kv_ids if kv in served]
        if groups and site.num_heads_orig % len(groups):
            raise ConfigError(kv_count_message(site.layer, len(groups), site.num_heads_orig))
        plans.append(LayerPlan(groups, site.num_heads_orig, widths[site.layer]))
    first = next((i for i, p in enumerate(plans) if p.has_attention or p.ffn_width), 0)
    # vLLM's residual stream starts at the first attention it runs: an FFN before it would fail in its fused add-and-norm,
    # so that layer keeps a zero attention over one KV head (n_heads_in_group = H) that adds exactly nothing
    if not plans[first].has_attention:
        plans[first] = replace(plans[first], placeholder=True)
    check_phantoms(model, {i for i, p in enumerate(plans) if not p.groups}, {i for i, p in enumerate(plans) if not p.ffn_width})
    return plans


def attention_tensors(site, plan: LayerPlan) -> dict[str, torch.Tensor]:
    """q/k/v/o weights of one layer in vLLM's shapes: H query heads, KV head j serving query heads j*n .. j*n + n - 1."""
    # vLLM always computes H query heads: pruned ones come back as zero q rows and o columns, which add exactly nothing
    d, n = site.head_dim, plan.n_heads_in_group
    weight = lambda which: site.linear(which).weight.detach().to("cpu", torch.float32)  # noqa: E731
    q, k, v, o = weight("query"), weight("key"), weight("value"), weight("output")
    hidden = q.shape[1]
    out = {
        "q_proj": torch.zeros(plan.heads * d, hidden),
        "k_proj": torch.zeros(plan.kv_heads * d, hidden),
        "v_proj": torch.zeros(plan.kv_heads * d, hidden),
        "o_proj": torch.zeros(o.shape[0], plan.heads * d),
    }
    for j, (kv, heads) in enumerate(plan.groups):
        src = site.kv_ids.index(kv)
        out["k_proj"][j * d : (j + 1) * d] = k[src * d : (src + 1) * d]
        out["v_proj"][j * d : (j + 1) * d] = v[src * d : (src + 1) * d]
        for i, head in enumerate(heads):
            row, dst = site.head_ids.index(head), j * n + i
            out["q_proj"][dst * d : (dst + 1) * d] = q[row * d : (row + 1) * d]
            out["o_proj"][:, dst * d : (dst + 1) * d] = o[:, row * d : (row + 1) * d]
    return out


def deci_tensors(model: nn.Module, plans: list[LayerPlan]) -> dict[str, torch.Tensor]:
    """Every tensor of the file by its transformers Llama name: a layer's attention or FFN tensors only where it runs."""
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    out = {}
    for name, tensor in state.items():
        plan = None if layer_index(name) is None else plans[layer_index(name)]
        left_out = (
            name.endswith("rotary_emb.inv_freq")
            or (name == "lm_head.weight" and model.config.tie_word_embeddings)
            or ".self_attn." in name  # rebuilt below in vLLM's shapes
            or (".input_layernorm." in name and not plan.has_attention)
            or ((".mlp." in name or ".post_attention_layernorm." in name) and not plan.ffn_width)
        )
        if not left_out:
            out[name] = tensor
    for position, site in enumerate(sorted(find_sites(model), key=lambda s: s.layer)):  # position: its index among the layers kept
        plan = plans[position]
        if plan.has_attention:
            for proj, tensor in attention_tensors(site, plan).items():
                out[f"model.layers.{position}.self_attn.{proj}.weight"] = tensor.contiguous()
    return out


def block_configs(plans: list[LayerPlan]) -> list[dict]:
    """``block_configs`` of config.json: per layer ``attention`` and ``ffn`` entries (no_op, n_heads_in_group, intermediate_size)."""
    return [
        {
            "attention": {"no_op": not p.has_attention, "replace_with_linear": False, "n_heads_in_group": p.n_heads_in_group},
            "ffn": {"no_op": not p.ffn_width, "replace_with_linear": False, "intermediate_size": p.ffn_width or None},
        }
        for p in plans
    ]


def deci_config(model: nn.Module, plans: list[LayerPlan]) -> dict:
    """config.json: the model's own fields, the full query-head count, ``block_configs``, and what vLLM loads it as."""
    from headprune.export.decilm_config import DeciLMConfig

    fields = {k: v for k, v in model.config.to_dict().items() if not k.startswith(RECORDS)}
    for key in (*NOT_COPIED, "sliding_window", "auto_map"):
        fields.pop(key, None)
    site = find_sites(model)[0]
    first = next(p for p in plans if p.has_attention)
    fields.update(
        num_attention_heads=site.num_heads_orig,
        head_dim=site.head_dim,
        num_key_value_heads=first.kv_heads,  # vLLM's model-wide count: its first attention's (each layer reads its own)
        intermediate_size=max([p.ffn_width for p in plans] + [1]),  # descriptive: each layer reads its own
        block_configs=block_configs(plans),
    )
    config = DeciLMConfig(**fields).to_dict()  # the shipped class checks the fields as vLLM will build it
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]  # transformers 4.x configs (vLLM's own pin may be one) read it here
    return {**config, "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "auto_map": AUTO_MAP}


def export_deci_hf(model: nn.Module, tokenizer, out: Path) -> dict:
    """Write config.json, its config module, model.safetensors, generation config and tokenizer into ``out``; returns a summary."""
    from safetensors.torch import save_file

    if why := refusal(model.config.to_dict()):
        raise ConfigError(why)
    plans = layer_plans(model)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(deci_config(model, plans), indent=2, sort_keys=True))
    shutil.copyfile(Path(__file__).with_name("decilm_config.py"), out / CONFIG_MODULE)
    save_file(deci_tensors(model, plans), str(out / "model.safetensors"), metadata={"format": "pt"})
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    if tokenizer is not None:
        save_tokenizer(tokenizer, out)
    return {
        "files": sorted(p for p in out.iterdir() if p.is_file()),
        # per layer as the check's reader reads block_configs back: query heads, KV heads (0: no attention), FFN width (0: none)
        "layout": [{"heads": p.heads if p.has_attention else 0, "kv_heads": p.kv_heads, "ffn": p.ffn_width} for p in plans],
        "padded_query_heads": [p.heads - sum(len(h) for _, h in p.groups) if p.has_attention else 0 for p in plans],  # zero heads
        "placeholder_layers": [i for i, p in enumerate(plans) if p.placeholder],
    }
