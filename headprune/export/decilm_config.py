"""The config class of a DeciLM (Nemotron-NAS) checkpoint written by headprune, shipped beside it as configuration_decilm.py."""

from transformers import LlamaConfig


class SubblockConfig:
    """One sub-block's entry (``attention`` or ``ffn``): its keys as attributes, only those given."""

    def __init__(self, values: dict):
        self.__dict__.update(values)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class BlockConfig:
    """One layer's entry of ``block_configs``: its attention and its FFN."""

    def __init__(self, attention: dict, ffn: dict):
        self.attention, self.ffn = SubblockConfig(attention), SubblockConfig(ffn)

    def to_dict(self) -> dict:
        return {"attention": self.attention.to_dict(), "ffn": self.ffn.to_dict()}


class DeciLMConfig(LlamaConfig):
    """A Llama config whose layers each have their own attention (KV heads, or none) and FFN width (or none)."""

    model_type = "nemotron-nas"

    def __init__(self, block_configs=None, **kwargs):
        super().__init__(**kwargs)
        self.block_configs = [b if isinstance(b, BlockConfig) else BlockConfig(**b) for b in block_configs or []]

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["block_configs"] = [b.to_dict() for b in self.block_configs]
        return out
