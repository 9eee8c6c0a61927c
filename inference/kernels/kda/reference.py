"""KDA references (fp32 PyTorch): varlen short causal conv, the decay gate, the gated delta rule.

The delta rule per head, with state `S` `[K, V]`, per-channel log decay `g_t` `[K]` and
`beta_t` scalar (`q`, `k` L2-normalised, `q` scaled by `K ** -0.5`)::

    S' = diag(exp(g_t)) S
    u_t = beta_t * (v_t - S'^T k_t)
    S_t = S' + k_t u_t^T
    o_t = S_t^T q_t

`kda_varlen_reference` runs it over a flat batch of sequences with per-sequence initial states (a
chunked form for prefill, the plain recurrence for one token); `kda_decode_ref` is the batched
one-token step that updates the state pool in place. The fast paths are fla's (`fast.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "causal_conv_varlen",
    "kda_chunk_ref",
    "kda_decode_ref",
    "kda_gate",
    "kda_recurrent_ref",
    "kda_varlen_reference",
    "l2norm",
]


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dim, as fla's kernels normalise q and k."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def kda_gate(f: Tensor, a_log: Tensor, dt_bias: Tensor) -> Tensor:
    """Per-channel log decay `-exp(A_log) * softplus(f + dt_bias)`.

    Args:
        f: `[T, H, K]` gate pre-activation (`f_b_proj(f_a_proj(x))`).
        a_log: any shape holding `H` values (published: `[1, 1, H, 1]`).
        dt_bias: `[H * K]`.
    Returns:
        `[T, H, K]` fp32, all <= 0.
    """
    _, h, k = f.shape
    x = f.float() + dt_bias.float().view(1, h, k)
    # softplus with the linear branch above 20, matching the reference implementations
    sp = torch.where(x > 20.0, x, torch.log1p(torch.exp(x.clamp(max=20.0))))
    return -torch.exp(a_log.float().reshape(1, h, 1)) * sp


def causal_conv_varlen(
    x: Tensor, window: Tensor, weight: Tensor, cu_seqlens: Tensor
) -> tuple[Tensor, Tensor]:
    """Depthwise causal conv + SiLU over a flat batch, continuing each sequence's window.

    Args:
        x: `[T, C]` new pre-conv inputs of all sequences, flattened.
        window: `[N, C, W]` the last `W = kernel - 1` inputs of each sequence (oldest first).
        weight: `[C, W + 1]` taps; the last tap multiplies the current token.
        cu_seqlens: `[N+1]` offsets of each sequence in `x` (on `x`'s device: the lengths are
            taken from it there, with no blocking copy from the host, which would sync the stream
            once per layer of a prefill step).
    Returns:
        `(y [T, C], new_window [N, C, W])`, `y` in `x.dtype`.
    """
    n, c, w = window.shape
    t = x.shape[0]
    if weight.shape != (c, w + 1):
        raise ValueError(f"conv weight must be [{c}, {w + 1}], got {tuple(weight.shape)}")
    dev = x.device
    if t == n and w > 0:  # pure decode: one token per sequence, no gathers and no host->device copy
        ext = torch.cat([window, x.to(window.dtype)[:, :, None]], dim=-1)  # [N, C, W + 1]
        y = F.silu((ext.float() * weight.float()[None]).sum(-1)).to(x.dtype)
        return y, ext[..., 1:]
    cu = cu_seqlens.to(device=dev, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    seq_id = torch.repeat_interleave(torch.arange(n, device=dev), lens, output_size=t)  # [T]
    rel = torch.arange(t, device=dev) - cu[seq_id]  # [T] position inside the new chunk
    ext = torch.cat([window.permute(0, 2, 1).reshape(n * w, c), x.to(window.dtype)], dim=0).float()

    def rows(seq: Tensor, r: Tensor) -> Tensor:
        # r: position relative to the chunk start; negative positions live in the window
        return torch.where(r >= 0, n * w + cu[seq] + r, seq * w + w + r)

    taps = torch.arange(w + 1, device=dev)
    idx = rows(seq_id[:, None], rel[:, None] + taps[None, :] - w)  # [T, W+1]
    y = (ext[idx] * weight.float().t()[None]).sum(dim=1)
    y = F.silu(y).to(x.dtype)
    if w == 0:
        return y, window
    tail = lens[:, None] - w + torch.arange(w, device=dev)[None, :]  # [N, W]
    new_window = ext[rows(torch.arange(n, device=dev)[:, None], tail)]  # [N, W, C]
    return y, new_window.permute(0, 2, 1).to(window.dtype)


def kda_recurrent_ref(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """Token-by-token delta rule for one sequence (fp32 reference).

    Args:
        q, k: `[L, H, K]` already L2-normalised; `q` already scaled.
        v: `[L, H, V]`; g: `[L, H, K]` log decay; beta: `[L, H]`.
        state: `[H, K, V]` initial state.
    Returns:
        `(o [L, H, V], final_state [H, K, V])`, fp32.
    """
    s = state.float().clone()
    out = []
    for i in range(q.shape[0]):
        s = s * torch.exp(g[i]).unsqueeze(-1)
        u = beta[i].unsqueeze(-1) * (v[i] - torch.einsum("hk,hkv->hv", k[i], s))
        s = s + k[i].unsqueeze(-1) * u.unsqueeze(-2)
        out.append(torch.einsum("hk,hkv->hv", q[i], s))
    return torch.stack(out), s


def kda_chunk_ref(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk: int = 32
) -> tuple[Tensor, Tensor]:
    """Chunked delta rule for one sequence (fp32 reference, same contract as the recurrence).

    Inside a chunk with cumulative log decay `G_t` and start state `S0`, the updates `U` solve
    `(I + A) U = diag(beta) (V - (K * exp(G)) S0)` with the strictly-lower
    `A[t, s] = beta_t sum_c k_t[c] k_s[c] exp(G_t[c] - G_s[c])`; then
    `O = (Q * exp(G)) S0 + P U` with the causal `P[t, s] = sum_c q_t[c] k_s[c] exp(G_t[c] - G_s[c])`
    and `S_end = exp(G_last) S0 + (K * exp(G_last - G))^T U`.
    """
    length = q.shape[0]
    pad = (-length) % chunk
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    s = state.float().clone()  # [H, K, V]
    eye = torch.eye(chunk, device=q.device, dtype=torch.float32)
    strict = torch.ones(chunk, chunk, device=q.device, dtype=torch.bool).tril(-1)
    causal = strict | eye.bool()
    outs = []
    for c0 in range(0, q.shape[0], chunk):
        qc, kc, vc = (x[c0 : c0 + chunk].transpose(0, 1).float() for x in (q, k, v))  # [H, C, *]
        gc = g[c0 : c0 + chunk].transpose(0, 1).float().cumsum(dim=1)  # [H, C, K]
        bc = beta[c0 : c0 + chunk].transpose(0, 1).float()  # [H, C]
        diff = gc[:, :, None, :] - gc[:, None, :, :]  # [H, C(t), C(s), K]
        decay = torch.exp(diff.masked_fill(~causal[None, :, :, None], float("-inf")))
        kk = torch.einsum("htc,hsc,htsc->hts", kc, kc, decay)
        a = bc[:, :, None] * kk * strict
        qk = torch.einsum("htc,hsc,htsc->hts", qc, kc, decay)
        gamma = torch.exp(gc)
        rhs = bc[:, :, None] * (vc - (kc * gamma) @ s)
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append(((qc * gamma) @ s + qk @ u).transpose(0, 1))
        last = gc[:, -1:, :]
        s = torch.exp(last).transpose(1, 2) * s + (kc * torch.exp(last - gc)).transpose(1, 2) @ u
    return torch.cat(outs)[:length], s


def kda_decode_ref(
    q: Tensor, k: Tensor, v: Tensor, f: Tensor, b: Tensor,
    a_log: Tensor, dt_bias: Tensor, state_pool: Tensor, slots: Tensor,
) -> Tensor:  # fmt: skip
    """One decode token per sequence; updates `state_pool[slots]` in place (batched reference).

    Args:
        q, k: `[N, H, K]` raw; v: `[N, H, V]`.
        f: `[N, H, K]` gate pre-activation (see `kda_gate`); b: `[N, H]` beta logits.
        a_log, dt_bias: the layer's decay parameters.
        state_pool: `[num_slots, H, K, V]` fp32; slots: `[N]` int64 (distinct).
    Returns:
        `o [N, H, V]` in `q.dtype`.
    """
    scale = q.shape[-1] ** -0.5
    qn, kn = l2norm(q.float()) * scale, l2norm(k.float())
    g = kda_gate(f, a_log, dt_bias)
    beta = torch.sigmoid(b.float())
    s = state_pool.index_select(0, slots) * torch.exp(g).unsqueeze(-1)
    u = beta.unsqueeze(-1) * (v.float() - torch.einsum("nhk,nhkv->nhv", kn, s))
    s = s + kn.unsqueeze(-1) * u.unsqueeze(-2)
    state_pool.index_copy_(0, slots, s)
    return torch.einsum("nhk,nhkv->nhv", qn, s).to(q.dtype)


def kda_varlen_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    states: Tensor,
    cu_seqlens: Tensor,
    query_lens_cpu: tuple[int, ...] | None,
) -> tuple[Tensor, Tensor]:
    """`inference.kernels.kda.kda_varlen`'s contract in fp32: the recurrence for one-token
    sequences, the chunked form for longer ones (lengths read from `cu_seqlens` when the host does
    not know them)."""
    scale = q.shape[-1] ** -0.5
    qn = l2norm(q.float()) * scale
    kn = l2norm(k.float())
    vf, gf, bf = v.float(), g.float(), beta.float()
    if query_lens_cpu is None:
        query_lens_cpu = tuple(cu_seqlens.diff().tolist())
    outs, finals = [], []
    start = 0
    for i, n in enumerate(query_lens_cpu):
        sl = slice(start, start + n)
        if n == 0:  # a padding sequence of a captured step: its state passes through
            outs.append(vf[sl])
            finals.append(states[i].float())
            continue
        fn = kda_recurrent_ref if n == 1 else kda_chunk_ref
        o, s = fn(qn[sl], kn[sl], vf[sl], gf[sl], bf[sl], states[i])
        outs.append(o)
        finals.append(s)
        start += n
    return torch.cat(outs).to(q.dtype), torch.stack(finals)
