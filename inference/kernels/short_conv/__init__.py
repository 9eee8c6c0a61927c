"""The KDA short causal conv: its decode step and its varlen prefill (`use_fast`: Triton on CUDA,
the references elsewhere; the prefill's reference is `inference.kernels.kda.causal_conv_varlen`)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.short_conv.reference import short_conv_decode_reference

__all__ = ["short_conv_decode", "short_conv_decode_reference", "short_conv_prefill"]


def short_conv_decode(x: Tensor, pool: Tensor, slots: Tensor, weight: Tensor, parts: int = 1) -> Tensor:
    """`[parts, N, C // parts]` conv outputs of one token per sequence; windows updated in place."""
    if use_fast(x):
        from inference.kernels.short_conv.fast import short_conv_decode_fast

        return short_conv_decode_fast(x, pool, slots, weight, parts)
    return short_conv_decode_reference(x, pool, slots, weight, parts)


def short_conv_prefill(
    x: Tensor, window: Tensor, weight: Tensor, cu_seqlens: Tensor
) -> tuple[Tensor, Tensor]:
    """`(y [T, C], new_window [N, C, W])`: the conv + SiLU of a flat varlen batch continuing each
    sequence's window; contract in `inference.kernels.kda.causal_conv_varlen`."""
    if use_fast(x, "short_conv"):
        from inference.kernels.short_conv.fast import causal_conv_varlen_fast

        return causal_conv_varlen_fast(x, window, weight, cu_seqlens)
    from inference.kernels.kda.reference import causal_conv_varlen

    return causal_conv_varlen(x, window, weight, cu_seqlens)
