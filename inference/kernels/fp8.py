"""FP8 (e4m3) rows with one fp32 scale each: the quantisation the FP8 latent and indexer caches use.

Shared by the cache writers (`model/cache_tensors.py`) and the kernels that read or score FP8 rows
(`kernels/dsa`): one definition of the format.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FP8_MAX", "quantize_rows_fp8"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_rows_fp8(rows: Tensor) -> tuple[Tensor, Tensor]:
    """`[T, D]` -> (`[T, D]` float8_e4m3fn, `[T]` fp32 scales) with `rows ~= q.float() * scale`."""
    amax = rows.detach().abs().amax(dim=-1).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (rows.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale
