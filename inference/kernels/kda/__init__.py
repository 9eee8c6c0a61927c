"""KDA's gated delta rule (and GDN's, on the same ops): fla's kernels beside the fp32 references.

`kda_varlen` runs the rule over a flat batch of sequences, each continuing its own state;
`kda_decode` is the one-token step that updates the state pool in place. Which path runs is
`inference.kernels.registry`'s decision (`registry.use_fla`, families `kda` and `kda_decode`); the
gate, the short conv and the references are exported for the model and the tests.
"""

from __future__ import annotations

import torch
from torch import Tensor

from inference.kernels import registry
from inference.kernels.kda.fast import (
    RECURRENT_MAX_TOKENS,
    kda_decode_fla,
    kda_varlen_fla,
    kda_varlen_gated_fla,
)
from inference.kernels.kda.reference import (
    causal_conv_varlen,
    kda_chunk_ref,
    kda_decode_ref,
    kda_gate,
    kda_recurrent_ref,
    kda_varlen_reference,
    l2norm,
)

__all__ = [
    "RECURRENT_MAX_TOKENS",
    "causal_conv_varlen",
    "kda_chunk_ref",
    "kda_decode",
    "kda_decode_ref",
    "kda_gate",
    "kda_recurrent_ref",
    "kda_varlen",
    "kda_varlen_gated",
    "kda_varlen_reference",
    "l2norm",
]


def kda_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    states: Tensor,
    cu_seqlens: Tensor,
    query_lens_cpu: tuple[int, ...] | None,
    *,
    use_fla: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Gated delta rule over a flat batch of sequences, each continuing its own state.

    Args:
        q, k: `[T, H, K]` raw (normalisation and scaling happen here); v: `[T, H, V]`.
        g: `[T, H, K]` fp32 log decay; beta: `[T, H]`.
        states: `[N, H, K, V]` fp32 initial states (gathered from the state pool).
        cu_seqlens: `[N+1]` offsets; query_lens_cpu: host lengths, or None when the host does
            not know them (a step captured in a CUDA graph): every sequence is then short
            (<= `RECURRENT_MAX_TOKENS`) and takes the recurrent kernel; the reference reads
            `cu_seqlens`.
        use_fla: force (True) or forbid (False) fla, for tests comparing the two; default:
            the registry's rule (family `kda`: CUDA, fla installed, a 16-bit dtype).
    Returns:
        `(o [T, H, V] in q.dtype, final_states [N, H, K, V] fp32)`.
    """
    fast = registry.use_fla(q, "kda") if use_fla is None else use_fla
    run = kda_varlen_fla if fast else kda_varlen_reference
    return run(q, k, v, g, beta, states, cu_seqlens, query_lens_cpu)


def kda_varlen_gated(
    q: Tensor, k: Tensor, v: Tensor, f: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor,
    states: Tensor, cu_seqlens: Tensor, query_lens_cpu: tuple[int, ...] | None,
    *, use_fla: bool | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`kda_varlen` from KDA's raw gate inputs: the decay `kda_gate(f, a_log, dt_bias)` and
    `beta = sigmoid(b)` (`f` `[T, H, K]`, `b` `[T, H]`). By the registry's rule (family `kda`)
    fla computes both inside its kernels; the reference computes them first."""
    fast = registry.use_fla(q, "kda") if use_fla is None else use_fla
    if fast:
        return kda_varlen_gated_fla(q, k, v, f, b, a_log, dt_bias, states, cu_seqlens, query_lens_cpu)
    g, beta = kda_gate(f, a_log, dt_bias), torch.sigmoid(b).float()
    return kda_varlen_reference(q, k, v, g, beta, states, cu_seqlens, query_lens_cpu)


def kda_decode(
    q: Tensor, k: Tensor, v: Tensor, f: Tensor, b: Tensor,
    a_log: Tensor, dt_bias: Tensor, state_pool: Tensor, slots: Tensor,
    *, use_fla: bool | None = None,
) -> Tensor:  # fmt: skip
    """`kda_decode_ref`'s contract; by the registry's rule (family `kda_decode`: CUDA, fla
    installed) one fla kernel (gate, beta, l2norm, in-place state)."""
    fast = registry.use_fla(q, "kda_decode") if use_fla is None else use_fla
    run = kda_decode_fla if fast else kda_decode_ref
    return run(q, k, v, f, b, a_log, dt_bias, state_pool, slots)
