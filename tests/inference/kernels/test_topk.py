"""Exact top-k positions (the DSA selection): the Triton radix select vs the PyTorch reference,
identical outputs (same tie rule: the lowest positions), and the reference vs `torch.topk`."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.topk import topk_positions
from inference.kernels.topk.reference import topk_positions_reference
from tests.inference.kernels.conftest import ERRORS, write_error_table


def _fast():
    from inference.kernels.topk.fast import topk_positions_fast

    return topk_positions_fast


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
