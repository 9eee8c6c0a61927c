"""`kda_varlen`'s fla paths vs its PyTorch reference on varlen batches of several multi-token
sequences, each continuing its own state: fla's recurrent kernel (decode and prefill chunks up to
`RECURRENT_MAX_TOKENS` per sequence) and, past it, the chunked one. On the GPU in bf16; elsewhere
the recurrent kernel in fp32 under Triton's interpreter. fla comes with the `gpu` extra: where it
is not installed (the CPU CI) these tests skip, saying so."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.kda import RECURRENT_MAX_TOKENS, kda_varlen, kda_varlen_gated
from tests.inference.kernels.helpers import TOL, assert_rel

pytest.importorskip("fla.ops.kda", reason="fla is not installed (pip install '.[gpu]')")

H, K, V = 4, 64, 64


def _case(lens: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k, v = (torch.randn(t, H, d, generator=g).to(device, dtype) for d in (K, K, V))
    gate = (-torch.rand(t, H, K, generator=g) * 2).to(device)
    beta = torch.rand(t, H, generator=g).to(device, dtype)
    states = torch.randn(len(lens), H, K, V, generator=g).to(device) * 0.1
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=device)
    return q, k, v, gate, beta, states, cu


def _check(lens, dtype, device, what: str) -> None:
    q, k, v, gate, beta, states, cu = _case(lens, dtype, device)
    ref_o, ref_s = kda_varlen(
        q.float().cpu(), k.float().cpu(), v.float().cpu(), gate.cpu(), beta.float().cpu(), states.cpu(),
        cu.cpu(), lens, use_fla=False,
    )  # fmt: skip
    o, s = kda_varlen(q, k, v, gate, beta, states.clone(), cu, lens, use_fla=True)
    assert_rel(o.float().cpu(), ref_o, TOL[dtype], f"kda {what} output lens={lens} {dtype}")
    assert_rel(s.cpu(), ref_s, TOL[dtype], f"kda {what} final state lens={lens} {dtype}")


RECURRENT = [(5, 70, 1, 33), (RECURRENT_MAX_TOKENS,), (1, 1, 1)]


@pytest.mark.parametrize("lens", RECURRENT, ids=lambda x: "-".join(map(str, x)))
def test_recurrent_path_matches_reference(lens, device):
    _check(lens, torch.bfloat16 if device.type == "cuda" else torch.float32, device, "recurrent")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens", [(RECURRENT_MAX_TOKENS + 1, 3), (300, 17, 64)], ids=lambda x: "-".join(map(str, x))
)
def test_gpu_chunked_path_matches_reference(lens, device):
    _check(lens, torch.bfloat16, device, "chunked")


def _check_gated(lens, dtype, device, what: str) -> None:
    """`kda_varlen_gated`: fla computing the gate and beta in its kernels vs the reference computing
    them first (published A_log shape `[1, 1, H, 1]`, dt_bias `[H * K]`)."""
    q, k, v, _, _, states, cu = _case(lens, dtype, device)
    g = torch.Generator().manual_seed(3)
    t = sum(lens)
    f = (torch.randn(t, H, K, generator=g) * 2).to(device, dtype)
    b = torch.randn(t, H, generator=g).to(device, dtype)
    a_log = torch.empty(1, 1, H, 1).uniform_(0.0, 2.7, generator=g).to(device)
    dt_bias = (torch.randn(H * K, generator=g) * 0.5).to(device)
    cpu = [x.float().cpu() for x in (q, k, v, f, b, a_log, dt_bias)]
    ref_o, ref_s = kda_varlen_gated(*cpu, states.cpu(), cu.cpu(), lens, use_fla=False)
    o, s = kda_varlen_gated(q, k, v, f, b, a_log, dt_bias, states.clone(), cu, lens, use_fla=True)
    assert_rel(o.float().cpu(), ref_o, TOL[dtype], f"kda gated {what} output lens={lens} {dtype}")
    assert_rel(s.cpu(), ref_s, TOL[dtype], f"kda gated {what} final state lens={lens} {dtype}")


@pytest.mark.parametrize("lens", RECURRENT, ids=lambda x: "-".join(map(str, x)))
def test_gated_recurrent_path_matches_reference(lens, device):
    _check_gated(lens, torch.bfloat16 if device.type == "cuda" else torch.float32, device, "recurrent")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens", [(RECURRENT_MAX_TOKENS + 1, 3), (300, 17, 64), (4096,)], ids=lambda x: "-".join(map(str, x))
)
def test_gpu_gated_chunked_path_matches_reference(lens, device):
    _check_gated(lens, torch.bfloat16, device, "chunked")
