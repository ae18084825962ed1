"""The config class of a DeciLM (Nemotron-NAS) checkpoint written by headprune, shipped beside it as configuration_decilm.py.

Standalone (transformers only, nothing of headprune): ``config.json`` names it in ``auto_map``, so
``AutoConfig.from_pretrained(folder, trust_remote_code=True)`` (what vLLM calls for ``model_type: nemotron-nas``) builds
it. It turns each ``block_configs`` entry into attributes, as vLLM's ``nemotron_nas.py`` reads them:
``block_configs[i].attention.no_op`` / ``.n_heads_in_group`` and ``block_configs[i].ffn.no_op`` / ``.intermediate_size``.
An FFN entry has no ``ffn_mult`` attribute, so vLLM takes ``intermediate_size`` as it is: ``ffn_mult`` would be
rounded up to a multiple of 256 neurons (``_ffn_mult_to_intermediate_size``), which a pruned width is not.
The base is Mistral's config (Llama's fields, and others such as the biases kept as given): LlamaConfig refuses a hidden
size that is no multiple of the query heads, which a model pruned in residual channels has, while vLLM reads the head
size from ``head_dim``. There is no sliding window (vLLM's nemotron_nas attends to every position).
"""

from transformers import MistralConfig


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
