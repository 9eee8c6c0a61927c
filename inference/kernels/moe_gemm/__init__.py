"""The routed experts' grouped GEMMs at decode sizes (`use_fast`: Triton on CUDA; contracts in
`reference.py`). `moe_gemm_fast_applies` is the one rule for when the model takes them instead of
`torch._grouped_mm` + SwiGLU."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.moe_gemm.reference import moe_down_reference, moe_up_reference

__all__ = ["moe_down", "moe_gemm_fast_applies", "moe_up"]


def moe_gemm_fast_applies(x: Tensor, pairs: int) -> bool:
    """Whether `pairs` sorted (token, slot) pairs of `x` run on the Triton kernels."""
    from inference.kernels.moe_gemm.fast import MAX_PAIRS

    return use_fast(x) and pairs <= MAX_PAIRS


def moe_up(x: Tensor, tok: Tensor, w13: Tensor, ends: Tensor) -> Tensor:
    """SwiGLU of each sorted pair's gate|up GEMM `[P, I]`; see `reference.py`."""
    if moe_gemm_fast_applies(x, tok.shape[0]):
        from inference.kernels.moe_gemm.fast import moe_up_fast

        return moe_up_fast(x, tok, w13, ends)
    return moe_up_reference(x, tok, w13, ends)


def moe_down(act: Tensor, w2: Tensor, ends: Tensor) -> Tensor:
    """Each sorted pair's down GEMM `[P, H]`; see `reference.py`."""
    if moe_gemm_fast_applies(act, act.shape[0]):
        from inference.kernels.moe_gemm.fast import moe_down_fast

        return moe_down_fast(act, w2, ends)
    return moe_down_reference(act, w2, ends)
