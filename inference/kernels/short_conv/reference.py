"""PyTorch reference of the decode step of the short causal conv (the Triton kernel's oracle).

One new token per sequence: its pre-conv input `x[n]` extends the window `pool[slots[n]]` (the
last `W` inputs, oldest first); the output is `silu(sum(window_ext * weight))` in fp32, cast to
`x.dtype`, and the window in the pool moves on by one token, in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["short_conv_decode_reference"]


def short_conv_decode_reference(
    x: Tensor, pool: Tensor, slots: Tensor, weight: Tensor, parts: int = 1
) -> Tensor:
    """Depthwise causal conv + SiLU of one token per sequence, updating the windows in place.

    Args:
        x: `[N, C]` pre-conv inputs of the new tokens.
        pool: `[num_slots, C, W]` conv windows (oldest first); rows `slots` are updated in place.
        slots: `[N]` int64 distinct slots.
        weight: `[C, W + 1]` taps (the last multiplies the current token).
        parts: the channels split into `parts` equal groups (q | k | v), returned as separate
            dense tensors: the output is `[parts, N, C // parts]`.
    Returns:
        `[parts, N, C // parts]` in `x.dtype`.
    """
    n, c = x.shape
    window = pool.index_select(0, slots)
    ext = torch.cat([window, x.to(pool.dtype)[:, :, None]], dim=-1)  # [N, C, W + 1]
    y = F.silu((ext.float() * weight.float()[None]).sum(-1)).to(x.dtype)
    pool.index_copy_(0, slots, ext[..., 1:])
    return y.view(n, parts, c // parts).transpose(0, 1).contiguous()
