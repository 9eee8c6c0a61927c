"""PyTorch reference of the MoE block at a handful of tokens: routed experts plus shared experts.

For each token `t` and each of its `k` slots `j` (expert `e = ids[t, j]`, weight `w = weights[t, j]`):
`w * down_e(silu(x_t @ gate_e^T) * (x_t @ up_e^T))`, summed over the slots in slot order, plus
the shared experts' SwiGLU MLP of `x_t` when given; all in fp32, rounded once to `x.dtype`. The
weights are the stacked layouts of `SparseMoE`: `w13 [E, 2I, H]` (gate rows `:I`, up rows `I:`),
`w2 [E, H, I]`; the shared experts' `(gate|up [2S, H], down [H, S])`.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["moe_gemv_reference"]


def _swiglu_mlp(x: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
    """x `[T, H]` fp32, w13 `[2I, H]`, w2 `[H, I]` -> `[T, H]` fp32."""
    i = w13.shape[0] // 2
    h = x @ w13.float().T
    return (F.silu(h[:, :i]) * h[:, i:]) @ w2.float().T


def moe_gemv_reference(
    x: Tensor,
    weights: Tensor,
    ids: Tensor,
    w13: Tensor,
    w2: Tensor,
    shared: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """x `[T, H]`, weights `[T, k]` fp32, ids `[T, k]` int64, w13 `[E, 2I, H]`, w2 `[E, H, I]`,
    shared `(gate|up [2S, H], down [H, S])` or None -> `[T, H]` in `x.dtype`."""
    xf = x.float()
    out = xf.new_zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t] += weights[t, j].float() * _swiglu_mlp(xf[t : t + 1], w13[e], w2[e])[0]
    if shared is not None:
        out += _swiglu_mlp(xf, *shared)
    return out.to(x.dtype)
