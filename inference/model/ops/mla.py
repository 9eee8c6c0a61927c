"""MLA and DSA attention ops over the paged latent cache: the seams the model calls.

Each op is a kernel family under `inference/kernels/` (a Triton fast path beside an fp32 PyTorch
reference, picked by `inference.kernels.use_fast`); this module only names them for the model.
`dsa_topk_indices` is the indexer over a dense key tensor (tests compare it with transformers).
"""

from __future__ import annotations

import torch
from torch import Tensor

from inference.kernels.dsa import dsa_topk_paged
from inference.kernels.mla_decode import mla_decode_paged
from inference.kernels.mla_prefill import mla_prefill_varlen

__all__ = ["dsa_topk_indices", "dsa_topk_paged", "mla_decode_paged", "mla_prefill_varlen"]


def dsa_topk_indices(
    q_index: Tensor, k_index: Tensor, weights: Tensor, context_len: int, topk: int
) -> tuple[Tensor, Tensor]:
    """Lightning-indexer selection over dense keys `k_index` `[S, D]` for `L` queries at
    positions `context_len + l`: `(indices [L, k] int64, valid [L, k] bool)`, `k = min(topk, S)`.

    The paged op with the keys as one block of one sequence (`-1` entries become `valid=False`).
    """
    length, s = q_index.shape[0], k_index.shape[0]
    pool = k_index[None]  # one block of S rows
    tables = torch.zeros(1, 1, dtype=torch.int32, device=k_index.device)
    lens = torch.arange(length, device=k_index.device) + context_len + 1
    rows = torch.zeros(length, dtype=torch.long, device=k_index.device)
    idx = dsa_topk_paged(q_index, weights, pool, tables, lens.clamp(max=s), topk=topk, table_rows=rows)
    valid = idx >= 0
    return idx.clamp(min=0), valid
