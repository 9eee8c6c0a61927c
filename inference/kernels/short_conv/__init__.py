"""Decode step of the KDA short causal conv (`use_fast`: Triton on CUDA, the reference elsewhere)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.short_conv.reference import short_conv_decode_reference

__all__ = ["short_conv_decode", "short_conv_decode_reference"]


def short_conv_decode(x: Tensor, pool: Tensor, slots: Tensor, weight: Tensor, parts: int = 1) -> Tensor:
    """`[parts, N, C // parts]` conv outputs of one token per sequence; windows updated in place."""
    if use_fast(x):
        from inference.kernels.short_conv.fast import short_conv_decode_fast

        return short_conv_decode_fast(x, pool, slots, weight, parts)
    return short_conv_decode_reference(x, pool, slots, weight, parts)
