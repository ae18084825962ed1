"""The config class of a DeciLM (Nemotron-NAS) checkpoint written by headprune, shipped beside it as configuration_decilm.py."""
# Standalone: vLLM reads block_configs[i].attention.no_op / n_heads_in_group and .ffn.no_op / intermediate_size (no ffn_mult,
# which it rounds to 256). Mistral's config as base: LlamaConfig refuses a hidden size no multiple of the heads; head_dim is read.

from types import SimpleNamespace

from transformers import MistralConfig


class BlockConfig:
    """One layer's entry of ``block_configs``: its attention and its FFN."""

    def __init__(self, attention: dict, ffn: dict):
        self.attention, self.ffn = SimpleNamespace(**attention), SimpleNamespace(**ffn)  # only the keys given, as attributes

    def to_dict(self) -> dict:
        return {"attention": dict(vars(self.attention)), "ffn": dict(vars(self.ffn))}


class DeciLMConfig(MistralConfig):
    """A Llama config whose layers each have their own attention (KV heads, or none) and FFN width (or none)."""

    model_type = "nemotron-nas"

    def __init__(self, block_configs=None, sliding_window=None, **kwargs):
        super().__init__(sliding_window=sliding_window, **kwargs)
        self.block_configs = [b if isinstance(b, BlockConfig) else BlockConfig(**b) for b in block_configs or []]

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["block_configs"] = [b.to_dict() for b in self.block_configs]
        return out
