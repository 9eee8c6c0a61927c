"""Exact top-k positions per row (the DSA indexer's selection): Triton radix select (`fast.py`), the
compact path for blocks of many long rows (`compact.py`), fp32 reference."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.topk.reference import topk_positions_reference

__all__ = ["topk_positions", "topk_positions_reference"]


def topk_positions(scores: Tensor, lens: Tensor, width: int, k_rows: Tensor | None = None) -> Tensor:
    """`[T, width]` positions of each row's largest visible scores; contract in
    `topk_positions_reference` (ascending positions, ties to the lowest, `-1` padding)."""
    if scores.dim() != 2 or lens.shape != scores.shape[:1]:
        raise ValueError(f"need scores [T, S] and lens [T], got {tuple(scores.shape)}, {tuple(lens.shape)}")
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    if k_rows is not None and k_rows.shape != lens.shape:
        raise ValueError(f"k_rows must be [{lens.shape[0]}], got {tuple(k_rows.shape)}")
    if use_fast(scores):
        from inference.kernels.topk.fast import topk_positions_fast

        return topk_positions_fast(scores, lens, width, k_rows)
    return topk_positions_reference(scores, lens, width, k_rows)
