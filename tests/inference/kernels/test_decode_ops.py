"""Fused decode ops (RMSNorm [+ residual], gated RMSNorm, short-conv decode step, sigmoid top-k
router): each Triton kernel vs its PyTorch reference (CPU: Triton's interpreter, small shapes;
`gpu`: the H200 at the benchmark model's shapes), and each reference vs an independent oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.kernels.moe_dispatch.fast import combine_fast, silu_mul_fast, sort_pairs_fast
from inference.kernels.moe_dispatch.reference import (
    combine_reference,
    silu_mul_reference,
    sort_pairs_reference,
)
from inference.kernels.moe_router.fast import sigmoid_topk_route_fast
from inference.kernels.moe_router.reference import sigmoid_topk_route_reference
from inference.kernels.rmsnorm.fast import add_rms_norm_fast, gated_rms_norm_fast, rms_norm_fast
from inference.kernels.rmsnorm.reference import (
    add_rms_norm_reference,
    gated_rms_norm_reference,
    rms_norm_reference,
)
from inference.kernels.short_conv.fast import short_conv_decode_fast
from inference.kernels.short_conv.reference import short_conv_decode_reference
from tests.inference.kernels.helpers import assert_rel

# a few roundings to bf16 (2^-8 relative each on the GPU; Triton's CPU interpreter truncates, up
# to 2^-7 each) plus fp32 reduction-order noise
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]
IDS = ["f32", "bf16"]


def _dev() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# -- references vs independent oracles (CPU) ---------------------------------------------------
def test_rms_norm_references_match_the_formula():
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)
    w, gate = torch.randn(64, generator=g), torch.randn(5, 64, generator=g)
    rstd = lambda v: (v.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()  # noqa: E731
    assert torch.allclose(rms_norm_reference(x, w, 1e-6), x * rstd(x) * w, atol=1e-6)
    y, s = add_rms_norm_reference(x, r, w, 1e-6)
    assert torch.equal(s, r + x) and torch.allclose(y, s * rstd(s) * w, atol=1e-6)
    want = x * rstd(x) * w * torch.sigmoid(gate)
    assert torch.allclose(gated_rms_norm_reference(x, gate, w, 1e-6), want, atol=1e-6)


def test_short_conv_reference_matches_the_sequence_conv():
    """The decode step equals the last output of a causal conv over window + token, and the
    pool's window moves on by one token (other slots untouched)."""
    g = torch.Generator().manual_seed(1)
    n, c, w = 3, 12, 3
    pool = torch.randn(6, c, w, generator=g)
    before = pool.clone()
    x, wt = torch.randn(n, c, generator=g), torch.randn(c, w + 1, generator=g)
    slots = torch.tensor([4, 0, 2])
    y = short_conv_decode_reference(x, pool, slots, wt, parts=3)
    for i, s in enumerate(slots.tolist()):
        seq = torch.cat([before[s], x[i][:, None]], dim=1)  # [C, W + 1]
        full = F.silu(F.conv1d(seq[None], wt[:, None, :], groups=c))[0, :, -1]
        assert torch.allclose(y[:, i].reshape(-1), full, atol=1e-5)
        assert torch.equal(pool[s], seq[:, 1:])
    assert torch.equal(pool[[1, 3, 5]], before[[1, 3, 5]])


def test_router_reference_matches_a_per_token_loop():
    g = torch.Generator().manual_seed(2)
    x, wt, b = torch.randn(4, 32, generator=g), torch.randn(8, 32, generator=g), torch.randn(8, generator=g)
    w, ids = sigmoid_topk_route_reference(x, wt, b, 3, True, 2.5)
    for t in range(4):
        s = torch.sigmoid(wt @ x[t])
        order = sorted(range(8), key=lambda e: -(s[e] + b[e]).item())[:3]
        assert ids[t].tolist() == order
        want = s[order] / s[order].sum() * 2.5
        assert torch.allclose(w[t], want, atol=1e-6)


def test_moe_dispatch_references_match_loops():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 6, (7, 3), generator=g)
    order, tok, place, ends = sort_pairs_reference(ids, 8)
    flat = ids.flatten().tolist()
    want = sorted(range(21), key=lambda i: (flat[i], i))  # stable by expert
    assert order.tolist() == want and tok.tolist() == [i // 3 for i in want]
    assert [order[p].item() for p in place.tolist()] == list(range(21))
    assert ends.tolist() == [sum(e <= x for e in flat) for x in range(8)]
    y = torch.randn(21, 5, generator=g)
    w = torch.rand(7, 3, generator=g)
    sh = torch.randn(7, 5, generator=g)
    got = combine_reference(y, place, w, sh)
    for t in range(7):
        ref = sum(w[t, j] * y[place[t * 3 + j]] for j in range(3)) + sh[t]
        assert torch.allclose(got[t], ref, atol=1e-5)
    h = torch.randn(4, 10, generator=g)
    assert torch.allclose(silu_mul_reference(h), h[:, :5] * torch.sigmoid(h[:, :5]) * h[:, 5:], atol=1e-6)


# -- kernels vs references (CPU interpreter; on CUDA the real kernels) ---------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("d", [64, 100])
def test_rms_norms_match_reference(dtype, d):
    dev = _dev()
    g = torch.Generator().manual_seed(d)
    x, r, gate = (torch.randn(7, d, generator=g).to(dev, dtype) for _ in range(3))
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(dev, dtype)
    assert_rel(
        rms_norm_fast(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), TOL[dtype], f"rmsnorm d={d} {dtype}"
    )
    y, s = add_rms_norm_fast(x, r, w, 1e-6)
    y_ref, s_ref = add_rms_norm_reference(x, r, w, 1e-6)
    if dev.type == "cuda":
        assert torch.equal(s, s_ref), "the residual sum is one rounding of x + r, as eager"
    else:  # Triton's interpreter truncates fp32 -> bf16 casts (the GPU rounds to nearest even)
        assert_rel(s, s_ref, TOL[dtype], f"add+rmsnorm residual d={d} {dtype}")
    assert_rel(y, y_ref, TOL[dtype], f"add+rmsnorm d={d} {dtype}")
    x3, g3 = x.view(7, 1, d).expand(7, 2, d), gate.view(7, 1, d).expand(7, 2, d)  # strided rows
    assert_rel(
        gated_rms_norm_fast(x3, g3, w.float(), 1e-6), gated_rms_norm_reference(x3, g3, w.float(), 1e-6),
        TOL[dtype], f"gated rmsnorm d={d} {dtype}",
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_short_conv_matches_reference(dtype):
    dev = _dev()
    g = torch.Generator().manual_seed(3)
    n, c, w = 3, 300, 3  # C not a multiple of the kernel's channel block
    pool = torch.randn(5, c, w, generator=g).to(dev, dtype)
    x, wt = torch.randn(n, c, generator=g).to(dev, dtype), torch.randn(c, w + 1, generator=g).to(dev, dtype)
    slots = torch.tensor([3, 0, 4], device=dev)
    p_fast, p_ref = pool.clone(), pool.clone()
    y = short_conv_decode_fast(x, p_fast, slots, wt, parts=3)
    y_ref = short_conv_decode_reference(x, p_ref, slots, wt, parts=3)
    assert_rel(y, y_ref, TOL[dtype], f"short conv {dtype}")
    assert torch.equal(p_fast, p_ref), "the window shift is a copy: bit-identical"


@pytest.mark.parametrize("renorm", [True, False])
def test_router_matches_reference(renorm):
    dev = _dev()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 96, generator=g).to(dev, torch.bfloat16)
    wt = torch.randn(12, 96, generator=g).to(dev, torch.bfloat16)
    b = (0.1 * torch.randn(12, generator=g)).to(dev)
    w, ids = sigmoid_topk_route_fast(x, wt, b, 4, renorm, 2.0)
    w_ref, ids_ref = sigmoid_topk_route_reference(x, wt, b, 4, renorm, 2.0)
    assert torch.equal(ids, ids_ref)
    assert_rel(w, w_ref, 1e-5, f"router renorm={renorm}")


@pytest.mark.parametrize(("t", "h", "e", "k"), [(2, 2048, 32, 4), (3, 1000, 256, 8), (1, 40, 5, 2)])
def test_router_splits_of_the_hidden_dim_match_reference(t, h, e, k):
    """The logits split over H (`split_plan`: 16 one-tile splits at the benchmark's [32, 2048];
    16 splits of four tiles, the last one partial, at [256, 1000]; one split when H is small)."""
    from inference.kernels.moe_router.fast import split_plan

    block_h, chunk, splits = split_plan(h, e)
    assert chunk % block_h == 0 and (splits - 1) * chunk < h <= splits * chunk and splits <= 16
    dev = _dev()
    g = torch.Generator().manual_seed(h + e)
    x = torch.randn(t, h, generator=g).to(dev, torch.bfloat16)
    wt = (torch.randn(e, h, generator=g) / h**0.5).to(dev, torch.bfloat16)
    b = (0.1 * torch.randn(e, generator=g)).to(dev)
    w, ids = sigmoid_topk_route_fast(x, wt, b, k, True, 2.5)
    w_ref, ids_ref = sigmoid_topk_route_reference(x, wt, b, k, True, 2.5)
    assert torch.equal(ids, ids_ref)
    assert_rel(w, w_ref, 1e-5, f"router split {t}x{h} E={e} k={k} ({splits} splits of {chunk})")


@pytest.mark.parametrize(("t", "k", "e"), [(1, 4, 32), (37, 3, 8), (50, 4, 5)])
def test_sort_pairs_matches_reference_exactly(t, k, e):
    ids = torch.randint(0, e, (t, k), generator=torch.Generator().manual_seed(t)).to(_dev())
    for got, want in zip(sort_pairs_fast(ids, e), sort_pairs_reference(ids, e), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_combine_and_silu_mul_match_reference(dtype):
    dev = _dev()
    g = torch.Generator().manual_seed(6)
    t, k, h = 5, 3, 1100  # H past one program's block
    y = torch.randn(t * k, h, generator=g).to(dev, dtype)
    w = torch.rand(t, k, generator=g).to(dev)
    sh = torch.randn(t, h, generator=g).to(dev, dtype)
    place = torch.randperm(t * k, generator=g).to(dev)
    for shared in (None, sh):
        got, want = combine_fast(y, place, w, shared), combine_reference(y, place, w, shared)
        assert_rel(got, want, TOL[dtype], f"moe combine shared={shared is not None} {dtype}")
    hh = torch.randn(4, 2 * 1030, generator=g).to(dev, dtype)
    assert_rel(silu_mul_fast(hh), silu_mul_reference(hh), TOL[dtype], f"silu_mul {dtype}")


def test_router_breaks_ties_to_the_lower_expert():
    x = torch.ones(1, 16, device=_dev())
    wt = torch.zeros(8, 16, device=_dev())  # every score sigmoid(0): a tie broken only by the bias
    b = torch.tensor([0.0, 0.2, 0.0, 0.2, 0.0, 0.0, 0.1, 0.0], device=_dev())
    _, ids = sigmoid_topk_route_fast(x, wt, b, 4, True, 1.0)
    assert ids.tolist() == [[1, 3, 6, 0]]


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # numpy, in Triton's interpreter
def test_router_names_valid_experts_for_a_nan_row():
    x = torch.full((2, 16), float("nan"), device=_dev())
    _, ids = sigmoid_topk_route_fast(
        x, torch.ones(8, 16, device=_dev()), torch.zeros(8, device=_dev()), 3, True, 1.0
    )
    assert ((ids >= 0) & (ids < 8)).all()


def test_shape_errors_say_what_is_wrong():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="weight"):
        sigmoid_topk_route_fast(x, torch.zeros(4, 9), torch.zeros(4), 2, True, 1.0)
    with pytest.raises(ValueError, match="pool"):
        short_conv_decode_fast(x, torch.zeros(3, 8, 3), torch.zeros(2, dtype=torch.long), torch.zeros(8, 3))
    with pytest.raises(ValueError, match="must match"):
        gated_rms_norm_fast(x, torch.zeros(2, 4), torch.ones(8), 1e-6)


# -- the H200 at the benchmark model's shapes --------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 32, 128, 300])
def test_gpu_norms_at_model_shapes(rows):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(rows)
    x, r = (torch.randn(rows, 2048, generator=g, device=dev).bfloat16() for _ in range(2))
    w = (1 + 0.1 * torch.randn(2048, generator=g, device=dev)).bfloat16()
    assert_rel(
        rms_norm_fast(x, w, 1e-6),
        rms_norm_reference(x, w, 1e-6),
        TOL[torch.bfloat16],
        f"gpu rmsnorm {rows}x2048",
    )
    y, s = add_rms_norm_fast(x, r, w, 1e-6)
    y_ref, s_ref = add_rms_norm_reference(x, r, w, 1e-6)
    assert torch.equal(s, s_ref)
    assert_rel(y, y_ref, TOL[torch.bfloat16], f"gpu add+rmsnorm {rows}x2048")
    o, gate = (torch.randn(rows, 16, 128, generator=g, device=dev).bfloat16() for _ in range(2))
    wn = (1 + 0.1 * torch.randn(128, generator=g, device=dev)).bfloat16()
    assert_rel(gated_rms_norm_fast(o, gate, wn, 1e-6), gated_rms_norm_reference(o, gate, wn, 1e-6),
               TOL[torch.bfloat16], f"gpu gated rmsnorm {rows}x16x128")  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 32, 128])
def test_gpu_short_conv_and_router_at_model_shapes(rows):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(rows)
    c = 3 * 16 * 128
    pool = torch.randn(2 * rows + 1, c, 3, generator=g, device=dev).bfloat16()
    x = torch.randn(rows, c, generator=g, device=dev).bfloat16()
    wt = torch.randn(c, 4, generator=g, device=dev).bfloat16()
    slots = torch.randperm(2 * rows + 1, device=dev)[:rows]
    p_fast, p_ref = pool.clone(), pool.clone()
    y = short_conv_decode_fast(x, p_fast, slots, wt, parts=3)
    assert_rel(y, short_conv_decode_reference(x, p_ref, slots, wt, parts=3), TOL[torch.bfloat16],
               f"gpu short conv {rows}x{c}")  # fmt: skip
    assert torch.equal(p_fast, p_ref)
    h = torch.randn(rows, 2048, generator=g, device=dev).bfloat16()
    rw = (0.02 * torch.randn(32, 2048, generator=g, device=dev)).bfloat16()
    b = 0.01 * torch.randn(32, generator=g, device=dev)
    w, ids = sigmoid_topk_route_fast(h, rw, b, 4, True, 2.446)
    w_ref, ids_ref = sigmoid_topk_route_reference(h, rw, b, 4, True, 2.446)
    # fp32 sums in another order: a near-tie may swap; every other row must agree exactly
    same = (ids == ids_ref).all(-1)
    assert same.float().mean() >= 0.97, f"router ids differ on {(~same).sum()} of {rows} rows"
    assert_rel(w[same], w_ref[same], 1e-5, f"gpu router {rows}x2048 E=32 k=4")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 32, 128, 512])
def test_gpu_moe_dispatch_at_model_shapes(rows):
    """The bookkeeping kernels exactly (sort) or within bf16 rounding (combine, SwiGLU), and the
    whole grouped-GEMM MoE with them vs the per-expert loop."""
    from inference.kernels.moe_experts import moe_experts_grouped, moe_experts_reference

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(rows)
    e, k, hid, inter = 32, 4, 2048, 768
    ids = torch.stack([torch.randperm(e, device=dev, generator=g)[:k] for _ in range(rows)])
    for got, want in zip(sort_pairs_fast(ids, e), sort_pairs_reference(ids, e), strict=True):
        assert torch.equal(got, want)
    _, _, place, _ = sort_pairs_fast(ids, e)
    y = torch.randn(rows * k, hid, generator=g, device=dev).bfloat16()
    w = torch.rand(rows, k, generator=g, device=dev)
    sh = torch.randn(rows, hid, generator=g, device=dev).bfloat16()
    assert_rel(combine_fast(y, place, w, sh), combine_reference(y, place, w, sh), TOL[torch.bfloat16],
               f"gpu moe combine {rows}x{hid} k={k}")  # fmt: skip
    hh = torch.randn(rows * k, 2 * inter, generator=g, device=dev).bfloat16()
    assert_rel(
        silu_mul_fast(hh), silu_mul_reference(hh), TOL[torch.bfloat16], f"gpu silu_mul {rows * k}x{inter}"
    )
    x = torch.randn(rows, hid, generator=g, device=dev).bfloat16()
    w13 = (0.02 * torch.randn(e, 2 * inter, hid, generator=g, device=dev)).bfloat16()
    w2 = (0.02 * torch.randn(e, hid, inter, generator=g, device=dev)).bfloat16()
    got = moe_experts_grouped(x, w, ids, w13, w2)
    want = moe_experts_reference(x, w, ids, list(w13[:, :inter]), list(w2), list(w13[:, inter:]))
    assert_rel(got, want, TOL[torch.bfloat16], f"gpu grouped MoE with the kernels {rows} tokens")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    "lens", [(37, 1, 2, 70), (1, 1, 1), (5,), (3, 0, 9), (0, 0)], ids=lambda x: "-".join(map(str, x))
)
def test_short_conv_prefill_matches_reference(lens, dtype):
    """The varlen prefill conv (each sequence continuing its window; sequences shorter than the
    window, one-token sequences, an empty one and a step of none) vs the reference, output and new windows."""
    from inference.kernels.kda.reference import causal_conv_varlen
    from inference.kernels.short_conv.fast import causal_conv_varlen_fast

    dev, g = _dev(), torch.Generator().manual_seed(sum(lens))
    c, w = 96, 3
    x = torch.randn(sum(lens), c, generator=g).to(dev, dtype)
    window = torch.randn(len(lens), c, w, generator=g).to(dev, dtype)
    wt = torch.randn(c, w + 1, generator=g).to(dev, dtype)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=dev)
    y, new = causal_conv_varlen_fast(x, window, wt, cu)
    y_ref, new_ref = causal_conv_varlen(x, window, wt, cu)
    assert_rel(y.float(), y_ref.float(), TOL[dtype], f"conv prefill output {lens}")
    assert torch.equal(new, new_ref), "the new windows are the last inputs, copied exactly"


@pytest.mark.gpu
def test_gpu_short_conv_prefill_at_model_shapes():
    """A 16K-token chunk of three sequences at the benchmark model's conv width (3 x 16 x 128)."""
    from inference.kernels.kda.reference import causal_conv_varlen
    from inference.kernels.short_conv.fast import causal_conv_varlen_fast

    g = torch.Generator().manual_seed(0)
    lens, c, w = (16000, 300, 84), 3 * 16 * 128, 3
    x = torch.randn(sum(lens), c, generator=g).to("cuda", torch.bfloat16)
    window = torch.randn(len(lens), c, w, generator=g).to("cuda", torch.bfloat16)
    wt = (torch.randn(c, w + 1, generator=g) * 0.5).to("cuda", torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
    y, new = causal_conv_varlen_fast(x, window, wt, cu)
    y_ref, new_ref = causal_conv_varlen(x, window, wt, cu)
    assert_rel(y.float(), y_ref.float(), TOL[torch.bfloat16], "conv prefill output at model shapes")
    assert torch.equal(new, new_ref)
