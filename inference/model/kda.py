"""Kimi Delta Attention layer (published parameter names), continuous-batching aware.

Per token: q, k, v projections -> short causal depthwise conv + SiLU (window kept per state slot)
-> per-channel decay gate and beta -> gated delta rule (state kept per state slot, fp32) ->
gated RMS norm with a low-rank output gate -> o_proj.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import ModelSpec
from inference.kernels.kda import kda_decode, kda_varlen_gated
from inference.kernels.short_conv import short_conv_decode, short_conv_prefill
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.fused_params import concat_params
from inference.model.layers import GatedRMSNorm

__all__ = ["KimiDeltaAttention", "ShortConv"]


class ShortConv(nn.Module):
    """Holds a depthwise conv weight `[C, 1, kernel]` under the name `weight` (fla's layout)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class KimiDeltaAttention(nn.Module):
    """KDA mixer for one layer. Reads/writes its state and conv window in the cache slots."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        kda = spec.kda
        hidden, dim, hd = spec.hidden_size, kda.proj_dim, kda.head_dim
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = kda.num_heads, hd
        self.q_proj = nn.Linear(hidden, dim, bias=False)
        self.k_proj = nn.Linear(hidden, dim, bias=False)
        self.v_proj = nn.Linear(hidden, dim, bias=False)
        self.q_conv1d = ShortConv(dim, kda.conv_kernel_size)
        self.k_conv1d = ShortConv(dim, kda.conv_kernel_size)
        self.v_conv1d = ShortConv(dim, kda.conv_kernel_size)
        self.A_log = nn.Parameter(torch.empty(1, 1, kda.num_heads, 1))
        self.dt_bias = nn.Parameter(torch.empty(dim))
        self.f_a_proj = nn.Linear(hidden, hd, bias=False)
        self.f_b_proj = nn.Linear(hd, dim, bias=False)
        self.b_proj = nn.Linear(hidden, kda.num_heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, hd, bias=False)
        self.g_b_proj = nn.Linear(hd, dim, bias=False)
        self.o_norm = GatedRMSNorm(hd, eps=spec.rms_norm_eps)
        self.o_proj = nn.Linear(dim, hidden, bias=False)
        self._in: Tensor | None = None
        self._conv: Tensor | None = None
        self._fg_b: Tensor | None = None

    def dummy_params(self, generator: torch.Generator) -> dict[str, Tensor]:
        """Decay parameters as fla initialises them (A in [1, 16], dt in [1e-3, 1e-1]), by name.

        Only shapes are read, so a meta-device layer gives the full-size values a sharded rank
        slices its heads from."""
        a = torch.empty(self.A_log.shape).uniform_(1.0, 16.0, generator=generator)
        dt = torch.exp(
            torch.rand(self.dt_bias.shape, generator=generator) * (math.log(0.1) - math.log(1e-3))
            + math.log(1e-3)
        ).clamp(min=1e-4)
        return {"A_log": a.log(), "dt_bias": dt + torch.log(-torch.expm1(-dt))}  # inverse softplus

    @torch.no_grad()
    def init_dummy(self, generator: torch.Generator) -> None:
        for name, value in self.dummy_params(generator).items():
            getattr(self, name).copy_(value)

    def _gates(self, fg_a: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """`(f_b_proj(f_a), g_b_proj(g_a))`, each `[T, H, D]`, as one batched GEMM.

        `fg_a` `[T, 2 * head_dim]` (f_a | g_a, a column slice of the input GEMM's output) is read
        as a strided `[2, T, head_dim]` view: no copy (cuBLAS takes the row stride as the leading
        dimension and the batch stride as it is), shapes fixed by T alone (CUDA-graph safe)."""
        hd = self.head_dim
        self._fg_b = concat_params([self.f_b_proj.weight, self.g_b_proj.weight], self._fg_b)
        w = self._fg_b.view(2, -1, hd)  # [2, dim, head_dim]: f_b, g_b
        f, gate = torch.bmm(fg_a.unflatten(-1, (2, hd)).transpose(0, 1), w.transpose(1, 2))
        return f.view(t, self.num_heads, hd), gate.view(t, self.num_heads, hd)

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`; updates `cache.state/conv[layer][meta.state_slots]`."""
        t, hidden = x.shape
        h, d = self.num_heads, self.head_dim
        slots = meta.state_slots.to(x.device)
        # every projection of x (q|k|v, the two low-rank gate inputs, beta) as one weight: one
        # GEMM (f_a | g_a adjacent, for the one batched GEMM after it); the three conv filters as
        # one tensor
        in_w = [self.q_proj, self.k_proj, self.v_proj, self.f_a_proj, self.g_a_proj, self.b_proj]
        self._in = concat_params([m.weight for m in in_w], self._in)
        self._conv = concat_params(
            [self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], self._conv
        )
        widths = [m.weight.shape[0] for m in in_w]
        parts = [sum(widths[:3]), sum(widths[3:5]), widths[5]]  # q|k|v, f_a|g_a, beta
        mixed, fg_a, b = F.linear(x, self._in.view(-1, hidden)).split(parts, -1)
        f, gate = self._gates(fg_a, t)
        conv_pool = cache.conv[self.layer_idx]
        if meta.is_pure_decode:
            # conv window step, SiLU and the q|k|v split in one kernel (windows updated in place),
            # then the delta rule in one fused kernel, its state updated in place in its slot
            q, k, v = short_conv_decode(mixed, conv_pool, slots, self._conv.view(3 * h * d, -1), parts=3)
            q, k, v = (z.view(t, h, d) for z in (q, k, v))
            o = kda_decode(q, k, v, f, b, self.A_log, self.dt_bias, cache.state[self.layer_idx], slots)
            return self.o_proj(self.o_norm(o, gate).reshape(t, h * d))
        mixed, window = short_conv_prefill(
            mixed, conv_pool.index_select(0, slots), self._conv.view(3 * h * d, -1),
            meta.cu_seqlens,
        )  # fmt: skip
        conv_pool.index_copy_(0, slots, window)
        q, k, v = (z.reshape(t, h, d) for z in mixed.split(h * d, dim=-1))
        state_pool = cache.state[self.layer_idx]
        # a captured short step knows its lengths on the device only (`ForwardMeta.row_seq`)
        q_lens = None if meta.row_seq is not None else meta.query_lens_cpu
        o, final = kda_varlen_gated(
            q,
            k,
            v,
            f,
            b,
            self.A_log,
            self.dt_bias,
            state_pool.index_select(0, slots),
            meta.cu_seqlens,
            q_lens,
        )
        state_pool.index_copy_(0, slots, final)
        return self.o_proj(self.o_norm(o, gate).reshape(t, h * d))
