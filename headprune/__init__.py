"""headprune: study and prune the attention heads of Transformers."""

from headprune.core.attention.gates import HeadGates
from headprune.core.block.gates import BlockGates
from headprune.core.counting import kv_cache_bytes_per_token, model_bytes, model_cost
from headprune.core.families import FAMILIES, Family, supported_model_types
from headprune.core.ffn.gates import FFNGates
from headprune.core.ffn.pruning import ffn_record, prune_ffn_mask, prune_neurons
from headprune.core.joint import JointGates
from headprune.core.pruning import prune_heads, prune_kv_groups, prune_mask, pruning_record
from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import prune_joint_mask, prune_unit_mask, unit_gates
from headprune.engine.ablation import MaskBatcher
from headprune.engine.ablation_causal import CausalMaskBatcher
from headprune.scoring.importance import attention_entropy, fisher_scores, importance_scores
from headprune.selection.costs import flops_cost_model
from headprune.selection.lsq import ffn_lsq_recoverer, lsq_recoverer
from headprune.selection.mask_search import PruneTarget, search_mask
from headprune.selection.schedule import iterative_prune
from headprune.selection.unit_costs import unit_bytes_cost_model, unit_flops_cost_model

__version__ = "0.1.0"
__all__ = [
    "HeadGates",
    "importance_scores",
    "fisher_scores",
    "attention_entropy",
    "prune_mask",
    "prune_heads",
    "prune_kv_groups",
    "pruning_record",
    "save_pruned",
    "load_pruned",
    "model_cost",
    "model_bytes",
    "kv_cache_bytes_per_token",
    "MaskBatcher",
    "CausalMaskBatcher",
    "flops_cost_model",
    "search_mask",
    "PruneTarget",
    "iterative_prune",
    "lsq_recoverer",
    "Family",
    "FAMILIES",
    "supported_model_types",
    "FFNGates",
    "JointGates",
    "prune_neurons",
    "prune_ffn_mask",
    "prune_joint_mask",
    "ffn_record",
    "BlockGates",
    "unit_gates",
    "prune_unit_mask",
    "unit_flops_cost_model",
    "unit_bytes_cost_model",
    "ffn_lsq_recoverer",
]
