"""The MoE block (routed + shared experts) at a handful of tokens: two GEMV kernels, no pair sort
(`fast.py`), beside its fp32 reference. `moe_gemv_applies` is the one rule for when `SparseMoE`
takes it instead of the grouped path (`moe_experts`)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.moe_gemv.reference import moe_gemv_reference

__all__ = ["moe_gemv", "moe_gemv_applies", "moe_gemv_reference"]


def moe_gemv_applies(x: Tensor) -> bool:
    """Whether the MoE block of the tokens `x [T, H]` runs as the GEMV kernels."""
    from inference.kernels.moe_gemv.fast import MAX_TOKENS

    return use_fast(x, "moe_gemv") and x.shape[0] <= MAX_TOKENS


def moe_gemv(
    x: Tensor,
    weights: Tensor,
    ids: Tensor,
    w13: Tensor,
    w2: Tensor,
    shared: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Routed experts (`w13 [E, 2I, H]`, `w2 [E, H, I]`) weighted by `weights [T, k]`, plus the shared
    experts' MLP: `[T, H]`; see `reference.py`."""
    if moe_gemv_applies(x):
        from inference.kernels.moe_gemv.fast import moe_gemv_fast

        return moe_gemv_fast(x, weights, ids, w13, w2, shared)
    return moe_gemv_reference(x, weights, ids, w13, w2, shared)
