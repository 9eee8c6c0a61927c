"""KDA fast paths: flash-linear-attention's kernels (CUDA, the `gpu` extra).

`kda_varlen_fla` takes fla's recurrent kernel for short sequences and its chunked one for long
prefills; `kda_decode_fla` is the decode-only path: one token per sequence, the gate and beta
activations fused into fla's recurrent kernel, and the state read and written in place in the state
pool (no gather/scatter copies, fixed shapes: a CUDA graph can capture it). Contracts: the
dispatchers in `__init__.py`; references: `reference.py`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["RECURRENT_MAX_TOKENS", "kda_decode_fla", "kda_varlen_fla", "kda_varlen_gated_fla"]

# The longest sequence of a step that still goes through fla's recurrent kernel rather than its
# chunked one. A cached agent turn (~65 new tokens over a 16K context) measured on the H200: the
# whole turn 6.6 ms of GPU time under 46 ms of host time, 20 ms of it in the 12 `chunk_kda` calls'
# Python (chunk indices, ~10 launches each). The recurrent kernel is one launch, exact to the
# reference on multi-token varlen sequences (fp32, Triton's interpreter), and walks each
# sequence's tokens one by one: fine for a few dozen, not for long prefills.
RECURRENT_MAX_TOKENS = 128


def _run(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, states: Tensor, cu_seqlens: Tensor,
    query_lens_cpu: tuple[int, ...] | None, **gate,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """fla's recurrent kernel for sequences of at most `RECURRENT_MAX_TOKENS` (or unknown host
    lengths), its chunked one otherwise; `gate`: fla's in-kernel gate/beta options."""
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    scale = q.shape[-1] ** -0.5
    cu = cu_seqlens.to(torch.long)
    args = (q[None], k[None], v[None], g[None], beta[None])
    if query_lens_cpu is None or max(query_lens_cpu, default=1) <= RECURRENT_MAX_TOKENS:
        o, final = fused_recurrent_kda(
            *args, scale=scale, initial_state=states, output_final_state=True,
            use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **gate,
        )  # fmt: skip
    else:
        cu_cpu = torch.tensor([0, *torch.tensor(query_lens_cpu).cumsum(0).tolist()], dtype=torch.long)
        o, final = chunk_kda(
            *args, scale=scale, initial_state=states, output_final_state=True,
            use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, **gate,
        )  # fmt: skip
    return o[0].to(q.dtype), final.float()


def kda_varlen_fla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    states: Tensor,
    cu_seqlens: Tensor,
    query_lens_cpu: tuple[int, ...] | None,
) -> tuple[Tensor, Tensor]:
    """`inference.kernels.kda.kda_varlen` through fla (the decay `g` given, fp32)."""
    return _run(q, k, v, g.float(), beta.to(q.dtype), states, cu_seqlens, query_lens_cpu)


def kda_varlen_gated_fla(
    q: Tensor, k: Tensor, v: Tensor, f: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor,
    states: Tensor, cu_seqlens: Tensor, query_lens_cpu: tuple[int, ...] | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`inference.kernels.kda.kda_varlen_gated` through fla: the gate `-exp(A_log) *
    softplus(f + dt_bias)` and `sigmoid(b)` computed inside fla's kernels (a long prefill's
    `[T, H, K]` fp32 decay is never written: the separate gate was ~7 elementwise passes over it)."""
    h = q.shape[1]
    gate = dict(
        A_log=a_log.reshape(h).float().contiguous(), dt_bias=dt_bias.float().contiguous(),
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
    )  # fmt: skip
    return _run(q, k, v, f.contiguous(), b.contiguous(), states, cu_seqlens, query_lens_cpu, **gate)


def kda_decode_fla(
    q: Tensor, k: Tensor, v: Tensor, f: Tensor, b: Tensor,
    a_log: Tensor, dt_bias: Tensor, state_pool: Tensor, slots: Tensor,
) -> Tensor:  # fmt: skip
    """`kda_decode_ref`'s contract in one fla kernel (gate, beta, l2norm, in-place state)."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    h = q.shape[1]
    o, _ = fused_recurrent_kda_fwd(
        q=q.contiguous()[:, None], k=k.contiguous()[:, None], v=v.contiguous()[:, None],
        g=f.contiguous()[:, None], beta=b.contiguous()[:, None],
        A_log=a_log.reshape(h).float().contiguous(), dt_bias=dt_bias.float().contiguous(),
        initial_state=state_pool, scale=q.shape[-1] ** -0.5,
        inplace_final_state=True, ssm_state_indices=slots,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
    )  # fmt: skip
    return o[:, 0]
