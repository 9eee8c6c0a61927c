"""The DeepSeek-V3 architecture from the shared layers: `deepseek_v3`, `deepseek_v32` (+DSA) and
`kimi_k2` (the Kimi-K2 / K2.5 text model) configs.

Every layer is `MLAttention` (q_lora, interleaved rope on the shared key, and the DSA lightning
indexer when the config has one); FFNs are `DenseMLP` for the first `first_k_dense_replace`
layers, then `SparseMoE` with sigmoid, bias-corrected grouped top-k routing. Nothing here is a
new operator: the `dayzero analyze --diff` of kimi_linear -> deepseek_v32 lists only DSA (which
the shared MLA layer already has) and YaRN (`inference.model.rope`, in the MLA layer).

What differs from `KimiLinearForCausalLM` is the checkpoint layout alone: MoE layers live under
`mlp` (not `block_sparse_moe`) with experts `mlp.experts.N.{gate,up,down}_proj`. The published
checkpoints also hold the MTP layers as `model.layers.{num_hidden_layers + i}.*`; the loader
skips them (`mtp_prefixes`).
"""

from __future__ import annotations

from inference.config import ModelSpec
from inference.model.kimi_linear import DecoderLayer, KimiLinearForCausalLM, KimiLinearModel
from inference.model.moe import DeepseekExpert

__all__ = ["DeepseekDecoderLayer", "DeepseekForCausalLM", "DeepseekModel", "mtp_prefixes"]


class DeepseekDecoderLayer(DecoderLayer):
    """`DecoderLayer` with DeepSeek-V3's MoE names."""

    moe_attr = "mlp"
    expert_cls = DeepseekExpert


class DeepseekModel(KimiLinearModel):
    layer_cls = DeepseekDecoderLayer


class DeepseekForCausalLM(KimiLinearForCausalLM):
    """Same `forward(input_ids, meta, cache)` contract as `KimiLinearForCausalLM`."""

    model_cls = DeepseekModel


def mtp_prefixes(spec: ModelSpec) -> tuple[str, ...]:
    """Checkpoint name prefixes of the MTP layers, which the served model does not build."""
    n = spec.mtp.num_layers if spec.mtp is not None else 0
    return tuple(f"model.layers.{spec.num_layers + i}." for i in range(n))
