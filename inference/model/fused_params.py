"""Several parameters stored back to back in one tensor, so one GEMM can read them all.

The published checkpoints keep e.g. `q_proj`, `k_proj`, `v_proj` (or every expert's `w1`/`w3`) as
separate tensors; a decode step wants one `[3 * dim, hidden]` weight and one GEMM. `concat_params`
copies the parameters into one buffer once and re-points each parameter's `.data` at its slice,
so names, `state_dict()` and in-place loading keep working and nothing is stored twice. When a
parameter is later replaced (a dtype cast, a move to another device), the buffer is rebuilt.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["concat_params"]


def _backs(params: Sequence[nn.Parameter], buf: Tensor) -> bool:
    """Whether `params` still live, in order and unchanged, inside `buf` (every one checked: a
    parameter replaced in the middle of the group must rebuild the buffer too)."""
    at, size = buf.data_ptr(), buf.element_size()
    for p in params:
        if p.dtype != buf.dtype or p.device != buf.device or p.data_ptr() != at:
            return False
        at += p.numel() * size
    return at == buf.data_ptr() + buf.numel() * size


def concat_params(params: Sequence[nn.Parameter], cached: Tensor | None) -> Tensor:
    """A flat buffer holding `params` back to back (rebuilt only when `cached` no longer backs them).

    The caller views the result in the shape it needs (e.g. `[rows, hidden]` for stacked linear
    weights of equal input width) and keeps it to pass back as `cached` on the next call.
    """
    if cached is not None and _backs(params, cached):
        return cached
    # a plain tensor even inside inference mode: loading into the parameters later must still work
    with torch.inference_mode(False), torch.no_grad():
        buf = torch.cat([p.detach().reshape(-1) for p in params])
        offset = 0
        for p in params:
            p.data = buf[offset : offset + p.numel()].view(p.shape)
            offset += p.numel()
    return buf
