"""Exact top-k positions (the DSA selection): the Triton radix select and the compact path (with its
radix fallback) vs the PyTorch reference, identical outputs (same tie rule: the lowest positions),
and the reference vs `torch.topk`. Under the interpreter the compact path runs with small
constants (`compact.CAP` 128, 32 samples, 64-key blocks), so its fallback and multi-chunk
compaction show at small shapes."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.topk import topk_positions
from inference.kernels.topk.reference import topk_positions_reference
from tests.inference.kernels.conftest import ERRORS, write_error_table


def _fast():
    from inference.kernels.topk.fast import topk_positions_fast

    return topk_positions_fast


def _compact_steps(s, lens, out, row0=0, k_rows=None) -> torch.Tensor:
    """The compact path without its fallback: `done` per row (1 = written by it)."""
    from inference.kernels.topk.fast import compact_rows

    return compact_rows(s, lens, out, row0, k_rows)


def _sample_positions(n: int) -> torch.Tensor:
    """The positions the compact path's guess samples in a row of `n` visible keys (> CAP)."""
    from inference.kernels.topk import compact

    segs, seg = compact.SAMPLE_SEGS, compact.SAMPLE_SEG
    starts = torch.arange(segs) * (n - seg) // (segs - 1)
    return (starts[:, None] + torch.arange(seg)[None, :]).flatten()


def _record(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    rows = (got != want).any(1).sum().item()
    ERRORS.append({"case": f"{what}: rows whose selection differs", "max_abs_err": rows, "rel_err": rows,
                   "tol": 0, "passed": rows == 0})  # fmt: skip
    write_error_table()
    assert rows == 0, f"{what}: {rows} rows differ"


def _scores(rows: int, keys: int, ties: bool, device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device).manual_seed(seed)
    s = torch.randn(rows, keys, generator=g, device=device)
    if ties:  # few distinct values: the k-th value is shared by many keys
        s = (s * 2).round()
        s[:, ::7] = 0.0
        s[:, 1::7] = -0.0  # equal to +0.0, as torch.topk sees them
    return s


def test_reference_selects_the_topk_set_in_position_order():
    s = _scores(4, 300, False, "cpu")
    lens = torch.tensor([300, 150, 7, 0], dtype=torch.int32)
    got = topk_positions_reference(s, lens, 20)
    for n, length in enumerate(lens.tolist()):
        want = s[n, :length].topk(min(20, length)).indices.sort().values if length else torch.empty(0)
        assert torch.equal(got[n, : want.numel()], want.long())
        assert (got[n, want.numel() :] == -1).all()


def test_reference_breaks_ties_to_the_lowest_positions():
    s = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0, 2.0, -0.0, 0.0]])
    lens = torch.tensor([8])
    assert topk_positions_reference(s, lens, 3).tolist() == [[1, 2, 4]]
    # 0.0 (position 3) and -0.0 (position 6) are equal: the lower position wins
    assert topk_positions_reference(s, lens, 6).tolist() == [[0, 1, 2, 3, 4, 5]]
    assert topk_positions_reference(s, lens, 7, torch.tensor([2])).tolist() == [[1, 2, -1, -1, -1, -1, -1]]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(("keys", "width"), [(300, 20), (1000, 64), (50, 100), (700, 700)])
def test_kernel_equals_reference(ties, keys, width, device):
    s = _scores(5, keys, ties, device, seed=keys)
    lens = torch.tensor([keys, keys // 2, 7, 0, 1], dtype=torch.int32, device=device)
    krows = torch.tensor([width, 3, width, 5, 0], dtype=torch.int32, device=device)
    for k_rows in (None, krows):
        got = _fast()(s, lens, width, k_rows)
        _record(
            f"topk {device.type} {keys} keys k={width} ties={ties}",
            got,
            topk_positions_reference(s, lens, width, k_rows),
        )


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_one_long_row_with_many_chunks(ties, device):
    """One row (batch-1 decode over a long context): many more chunks than the find step reads per
    load, the last load partial (15 chunks of 320 keys in the interpreter)."""
    s = _scores(1, 4500, ties, device, seed=3)
    lens = torch.tensor([4480], dtype=torch.int32, device=device)
    got = _fast()(s, lens, 50)
    _record(
        f"topk {device.type} one row 4500 keys k=50 ties={ties}", got, topk_positions_reference(s, lens, 50)
    )


def _check_compact(what, s, lens, width, k_rows=None, expect_done=None):
    """The compact path alone (rows it leaves must say so, rows it writes must be exact), then the
    whole of it with the fallback, vs the reference; `expect_done` pins rows' outcomes."""
    want = topk_positions_reference(s, lens, width, k_rows)
    out = torch.full((s.shape[0], width), -7, dtype=torch.long, device=s.device)
    done = _compact_steps(s, lens, out, 0, k_rows).bool()
    assert (out[~done] == -7).all(), f"{what}: a row left to the fallback was written"
    _record(f"{what} (compact rows)", out[done], want[done])
    if expect_done is not None:
        assert done.tolist() == expect_done, f"{what}: done {done.int().tolist()}"
    _record(what, _fast()(s, lens, width, k_rows, method="compact"), want)
    return done


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_compact_equals_reference(ties, device):
    """Lens 0, < k, <= CAP (every key a candidate), just over CAP, long; rows of 1000 keys (not a
    multiple of the block; 8 compaction chunks a row); k_rows incl. 0; -0.0 and +0.0 (ties)."""
    s = _scores(8, 1000, ties, device, seed=11)
    lens = torch.tensor([1000, 999, 300, 128, 129, 10, 0, 700], dtype=torch.int32, device=device)
    krows = torch.tensor([16, 5, 16, 16, 0, 16, 3, 1], dtype=torch.int32, device=device)
    for k_rows in (None, krows):
        done = _check_compact(f"compact {device.type} 1000 keys k=16 ties={ties}", s, lens, 16, k_rows)
        assert done[lens <= 128].all()  # every visible key a candidate: never a fallback
        if not ties:  # sampled rows are selected by the compact path too (this seed: most)
            assert done[lens > 128].sum() >= 2


def test_compact_into_a_block_of_a_larger_output(device):
    """row0 > 0: lens/k_rows indexed like `out`, rows outside the block untouched."""
    from inference.kernels.topk.fast import select_rows

    s = _scores(5, 700, False, device, seed=5)
    lens = torch.tensor([9, 9, 9, 700, 650, 100, 600, 20, 9], dtype=torch.int32, device=device)
    krows = torch.tensor([1, 1, 1, 12, 12, 12, 7, 12, 1], dtype=torch.int32, device=device)
    out = torch.full((9, 12), -7, dtype=torch.long, device=device)
    select_rows(s, lens, out, 3, krows, method="compact")
    want = topk_positions_reference(s, lens[3:8], 12, krows[3:8])
    _record(f"compact {device.type} row0=3", out[3:8], want)
    assert (out[:3] == -7).all() and (out[8:] == -7).all()


def test_compact_all_equal_rows_fall_back(device):
    """Every key ties: over CAP of them is a fallback; at most CAP, the compact select's tie search."""
    s = torch.full((3, 600), 0.5, device=device)
    s[2, ::2] = -0.0
    s[2, 1::2] = 0.0
    lens = torch.tensor([600, 100, 600], dtype=torch.int32, device=device)
    _check_compact(f"compact {device.type} all equal", s, lens, 20, expect_done=[False, True, False])


def test_compact_guess_misses_fall_back(device):
    """The sample is not the row: (0) only sampled keys are large, so fewer than k keys reach the
    threshold; (1) a cluster of more than CAP large keys between sample points overflows the
    buffer; (2) an ordinary row beside them."""
    from inference.kernels.topk import compact

    n = 1000
    s = _scores(3, n, False, device, seed=2)
    sampled = _sample_positions(n).to(device)
    s[0, sampled] += 10.0
    gap = torch.ones(n, dtype=torch.bool)
    gap[sampled.cpu()] = False
    cluster = gap.nonzero().flatten()[: compact.CAP + 10].to(device)
    s[1, cluster] += 50.0
    lens = torch.full((3,), n, dtype=torch.int32, device=device)
    _check_compact(f"compact {device.type} guess misses", s, lens, 16, expect_done=[False, False, True])


def test_compact_width_over_cap(device):
    """width > CAP: rows wanting at most CAP are written by the compact path (their -1 tail runs
    past CAP), rows wanting more fall back."""
    s = _scores(4, 1000, False, device, seed=4)
    lens = torch.tensor([1000, 1000, 150, 1000], dtype=torch.int32, device=device)
    krows = torch.tensor([10, 150, 140, 3], dtype=torch.int32, device=device)
    done = _check_compact(f"compact {device.type} width 150 > CAP", s, lens, 150, krows)
    assert not done[1] and not done[2]


def test_dispatch_rule_and_method(monkeypatch, device):
    from inference.kernels.topk import compact, fast

    cap = compact.CAP
    assert compact.use_compact(64, 4 * cap, cap // 4)
    assert not compact.use_compact(63, 4 * cap, cap // 4)  # decode-sized blocks: the radix path
    assert not compact.use_compact(64, 4 * cap - 1, cap // 4)
    assert not compact.use_compact(64, 4 * cap, cap // 4 + 1)
    monkeypatch.setattr(compact, "AUTO_COMPACT", False)  # the A/B switch: auto is the radix select
    assert not compact.use_compact(64, 4 * cap, cap // 4)
    monkeypatch.setattr(compact, "AUTO_COMPACT", True)
    calls = []
    real = compact.compact_select
    monkeypatch.setattr(compact, "compact_select", lambda *a: calls.append(1) or real(*a))
    s = _scores(2, 4 * cap, False, device, seed=9)
    lens = torch.full((2,), 4 * cap, dtype=torch.int32, device=device)
    want = topk_positions_reference(s, lens, 8)
    assert torch.equal(_fast()(s, lens, 8), want) and not calls  # 2 rows: radix
    monkeypatch.setattr(compact, "_MIN_ROWS", 2)
    assert torch.equal(_fast()(s, lens, 8), want) and calls  # auto now takes the compact path
    assert torch.equal(_fast()(s, lens, 8, method="radix"), want) and len(calls) == 1
    with pytest.raises(ValueError, match="method"):
        fast.select_rows(s, lens, torch.empty(2, 8, dtype=torch.long, device=device), 0, method="heap")


def test_dispatch_rejects_bad_input():
    s = torch.zeros(2, 10)
    with pytest.raises(ValueError, match="width"):
        topk_positions(s, torch.tensor([3, 4]), 0)
    with pytest.raises(ValueError, match="k_rows"):
        topk_positions(s, torch.tensor([3, 4]), 2, torch.tensor([1]))


@pytest.mark.gpu
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(
    ("lens", "width"),
    [
        ([131072] * 32, 2048),
        ([131072], 2048),
        ([131072, 100, 5000, 2048, 2049, 0, 70000, 1], 2048),
        ([3000] * 64, 4096),
        ([8192] * 256, 2048),
    ],
    ids=["b32-128k", "b1-128k", "b8-ragged", "k>=ctx", "b256-8k"],
)
def test_gpu_kernel_equals_reference(lens, width, ties):
    dev = torch.device("cuda")
    s = _scores(len(lens), max(lens), ties, dev, seed=len(lens))
    seq = torch.tensor(lens, dtype=torch.int32, device=dev)
    k_rows = torch.randint(0, width + 1, (len(lens),), device=dev, dtype=torch.int32)
    for kr in (None, k_rows):
        got = _fast()(s, seq, width, kr)
        want = topk_positions_reference(s, seq, width, kr)
        _record(f"gpu topk {len(lens)}x{max(lens)} k={width} ties={ties} k_rows={kr is not None}", got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_gpu_compact_at_prefill_shape(ties):
    """A DSA prefill block (256 rows x 128K keys, k 2048, ragged lens): both paths vs the
    reference; with distinct scores (nearly) every row is the compact path's own."""
    dev = torch.device("cuda")
    rows, keys, width = 256, 131072, 2048
    s = _scores(rows, keys, ties, dev, seed=rows)
    lens = torch.arange(keys - rows, keys, device=dev, dtype=torch.int32) + 1
    lens[:8] = torch.tensor([0, 1, 2047, 2048, 5000, 8192, 8193, 40000], dtype=torch.int32, device=dev)
    k_rows = torch.randint(0, width + 1, (rows,), device=dev, dtype=torch.int32)
    for kr in (None, k_rows):
        want = topk_positions_reference(s, lens, width, kr)
        for method in ("compact", "radix", "auto"):
            got = _fast()(s, lens, width, kr, method=method)
            _record(
                f"gpu topk {method} {rows}x{keys} k={width} ties={ties} k_rows={kr is not None}", got, want
            )
        done = _compact_steps(s, lens, torch.empty_like(want), 0, kr)
        if not ties:
            assert done.float().mean().item() > 0.98, done.float().mean().item()


@pytest.mark.gpu
def test_gpu_compact_in_a_cuda_graph():
    """No host synchronisation: the compact path (fallback included) captures and replays."""
    from inference.kernels.topk.fast import select_rows

    dev = torch.device("cuda")
    s = _scores(128, 65536, False, dev, seed=1)
    s[0] = 1.0  # an all-equal row: the fallback runs inside the graph
    lens = torch.full((128,), 65536, dtype=torch.int32, device=dev)
    out = torch.empty(128, 2048, dtype=torch.long, device=dev)
    select_rows(s, lens, out, 0, method="compact")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        select_rows(s, lens, out, 0, method="compact")
    out.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    _record("gpu topk compact in a CUDA graph", out, topk_positions_reference(s, lens, 2048))
