"""KDA op references against each other and against transformers' conv/KDA references."""

from __future__ import annotations

import importlib

import pytest
import torch

from inference.kernels.kda import causal_conv_varlen, kda_chunk_ref, kda_recurrent_ref, kda_varlen, l2norm
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel


def _inputs(length: int, h: int = 2, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(length, h, d, generator=g) for _ in range(3))
    gate = -torch.rand(length, h, d, generator=g) * 2
    beta = torch.rand(length, h, generator=g)
    return q, k, v, gate, beta


@pytest.mark.parametrize("length", [1, 31, 32, 77], ids=lambda n: f"len{n}")
def test_chunked_reference_equals_recurrence(length):
    q, k, v, g, b = _inputs(length)
    s0 = torch.randn(2, 16, 16)
    qn, kn = l2norm(q) * 16**-0.5, l2norm(k)
    o1, s1 = kda_recurrent_ref(qn, kn, v, g, b, s0)
    o2, s2 = kda_chunk_ref(qn, kn, v, g, b, s0, chunk=32)
    assert_close_rel(o2, o1, FP32_REL_TOL, "chunk vs recurrent output")
    assert_close_rel(s2, s1, FP32_REL_TOL, "chunk vs recurrent state")


def test_matches_transformers_kda_references():
    mod = importlib.import_module("transformers.models.kimi_linear.modeling_kimi_linear")
    q, k, v, g, b = _inputs(70)
    s0 = torch.randn(1, 2, 16, 16)
    ref_o, ref_s = mod.chunk_kimi_delta_attention(
        q[None], k[None], v[None], g[None], b[None], initial_state=s0, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    o, s = kda_varlen(q, k, v, g, b, s0, torch.tensor([0, 70]), (70,), use_fla=False)
    assert_close_rel(o, ref_o[0], FP32_REL_TOL, "KDA output vs transformers")
    assert_close_rel(s, ref_s, FP32_REL_TOL, "KDA final state vs transformers")


def test_varlen_conv_continues_each_window():
    g = torch.Generator().manual_seed(1)
    c, kernel = 6, 4
    weight = torch.randn(c, kernel, generator=g)
    seqs = [torch.randn(n, c, generator=g) for n in (5, 1, 9)]
    windows = torch.randn(3, c, kernel - 1, generator=g)
    cu = torch.tensor([0, 5, 6, 15])
    y, new = causal_conv_varlen(torch.cat(seqs), windows, weight, cu)
    for i, x in enumerate(seqs):
        full = torch.cat([windows[i].t(), x])  # [W + n, C]
        want = torch.stack(
            [torch.nn.functional.silu((full[j : j + kernel] * weight.t()).sum(0)) for j in range(x.shape[0])]
        )
        assert_close_rel(y[cu[i] : cu[i + 1]], want, FP32_REL_TOL, f"conv output of sequence {i}")
        assert torch.equal(new[i], full[-(kernel - 1) :].t()), f"window of sequence {i}"


def test_pure_decode_conv_equals_the_general_path():
    g = torch.Generator().manual_seed(2)
    weight, x, windows = (
        torch.randn(6, 4, generator=g),
        torch.randn(3, 6, generator=g),
        torch.randn(3, 6, 3, generator=g),
    )
    y, new = causal_conv_varlen(x, windows, weight, torch.tensor([0, 1, 2, 3]))
    for i in range(3):  # each alone, padded with a second dummy sequence to force the general path
        xi = torch.cat([x[i : i + 1], torch.zeros(2, 6)])
        yi, ni = causal_conv_varlen(xi, windows[[i, i]], weight, torch.tensor([0, 1, 3]))
        assert torch.allclose(y[i], yi[0], rtol=0, atol=1e-6) and torch.equal(new[i], ni[0])


def test_decode_reference_updates_the_slots_in_place_like_the_recurrence():
    """`kda_decode_ref` (gate + beta inside, state in its pool slot) equals the per-sequence
    recurrence on explicitly gated inputs, and leaves the other slots untouched."""
    from inference.kernels.kda import kda_decode, kda_gate

    gen = torch.Generator().manual_seed(3)
    n, h, d, num_slots = 3, 2, 16, 6
    q, k, v, f = (torch.randn(n, h, d, generator=gen) for _ in range(4))
    b = torch.randn(n, h, generator=gen)
    a_log = torch.rand(1, 1, h, 1, generator=gen).log()
    dt_bias = torch.randn(h * d, generator=gen) * 0.1
    pool = torch.randn(num_slots, h, d, d, generator=gen)
    slots = torch.tensor([4, 0, 2])
    before = pool.clone()
    o = kda_decode(q, k, v, f, b, a_log, dt_bias, pool, slots)  # CPU: the reference
    g = kda_gate(f[:, None].reshape(n, h, d), a_log, dt_bias)
    for i, slot in enumerate(slots.tolist()):
        qn, kn = l2norm(q[i : i + 1]) * d**-0.5, l2norm(k[i : i + 1])
        o_ref, s_ref = kda_recurrent_ref(
            qn, kn, v[i : i + 1], g[i : i + 1], torch.sigmoid(b[i : i + 1]), before[slot]
        )
        assert_close_rel(o[i], o_ref[0], FP32_REL_TOL, f"decode output of sequence {i}")
        assert_close_rel(pool[slot], s_ref, FP32_REL_TOL, f"state of slot {slot}")
    untouched = [1, 3, 5]
    assert torch.equal(pool[untouched], before[untouched])
