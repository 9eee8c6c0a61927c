"""DSA indexer top-k over the paged indexer keys: the Triton scorer + top-k vs the fp32 reference;
sparse attention over the selection (the decode kernel with indices) at k >= context is dense."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.dsa import dsa_topk_paged
from inference.kernels.dsa.reference import dsa_scores_reference, dsa_topk_paged_reference
from inference.kernels.mla_decode.reference import mla_decode_paged_reference, paged_rows
from inference.model.cache_tensors import quantize_rows_fp8
from inference.model.ops.mla import dsa_topk_indices
from tests.inference.kernels.conftest import ERRORS, write_error_table
from tests.inference.kernels.helpers import assert_rel, paged_pool


def _case(lens, page, hi, d, dtype, device, seed=0):
    width = max(-(-n // page) for n in lens) + 1
    pool, _, tables = paged_pool(lens, page, width, d, dtype, device, seed)
    g = torch.Generator(device).manual_seed(seed + 1)
    q = torch.randn(len(lens), hi, d, generator=g, device=device).to(dtype)
    w = torch.randn(len(lens), hi, generator=g, device=device) * hi**-0.5
    return q, w, pool, tables, torch.tensor(lens, dtype=torch.int32, device=device)


def _fp8_in_block(pool):
    """`pool` `[blocks, page, D]` quantised into the FP8 cache's layout (each block: its e4m3 keys,
    then their fp32 scales): returns the strided (keys, scales) views the kernels get."""
    nb, page, d = pool.shape
    q, scale = quantize_rows_fp8(pool.reshape(-1, d).float())
    raw = torch.empty(nb, page * (d + 4), dtype=torch.uint8, device=pool.device)
    raw[:, : page * d] = q.view(torch.uint8).view(nb, page * d)
    raw[:, page * d :] = scale.view(nb, page).view(torch.uint8).view(nb, page * 4)
    keys = raw[:, : page * d].view(torch.float8_e4m3fn).view(nb, page, d)
    return keys, raw[:, page * d :].view(torch.float32)


def _scores(q, w, pool, tables, lens):
    """Reference scores `[N, S]` of every key (to judge a selection whose ties may differ)."""
    page = pool.shape[1]
    s = tables.shape[1] * page
    pos = torch.arange(s, device=q.device).expand(q.shape[0], s)
    keys = pool.view(-1, pool.shape[-1])[paged_rows(tables, pos, page)].float()
    per_head = torch.relu(torch.einsum("thd,tsd->ths", q.float(), keys) * q.shape[-1] ** -0.5)
    score = torch.einsum("th,ths->ts", w.float(), per_head)
    return score.masked_fill(pos >= lens[:, None].long(), float("-inf"))


def _assert_valid_topk(idx, scores, lens, k, tol, what):
    """Each row lists min(k, len) distinct visible keys whose reference scores are a top-k up to `tol`."""
    for n in range(idx.shape[0]):
        want = min(k, int(lens[n]))
        sel = idx[n][idx[n] >= 0]
        assert sel.numel() == want, f"{what}: row {n} selected {sel.numel()} keys, expected {want}"
        assert sel.unique().numel() == want and int(sel.max()) < int(lens[n]), f"{what}: row {n} bad indices"
        kth = scores[n].topk(want).values[-1]
        worst = scores[n][sel].min()
        shortfall = float((kth - worst) / scores[n][: int(lens[n])].abs().max())
        ERRORS.append({"case": f"{what} row {n} (score shortfall of the worst pick vs the k-th best)",
                       "max_abs_err": float(kth - worst), "rel_err": max(shortfall, 0.0), "tol": tol,
                       "passed": shortfall <= tol})  # fmt: skip
        write_error_table()
        assert shortfall <= tol, f"{what}: row {n} missed a top key"


def test_reference_picks_the_top_scores():
    q, w, pool, tables, lens = _case([1, 20, 64, 7], 16, 4, 16, torch.float32, "cpu")
    idx = dsa_topk_paged_reference(q, w, pool, tables, lens, topk=10)
    assert idx.shape == (4, 10)
    _assert_valid_topk(idx, _scores(q, w, pool, tables, lens), lens, 10, 0.0, "reference")


@pytest.mark.parametrize("topk", [5, 1000], ids=["k<ctx", "k>=ctx"])
@pytest.mark.parametrize("page", [16, 64], ids=["page16", "page64"])
def test_kernel_matches_reference(fast, device, topk, page):
    q, w, pool, tables, lens = _case([1, 20, 64, 90], page, 4, 16, torch.float32, device, seed=page)
    got = fast.dsa.dsa_topk_paged_fast(q, w, pool, tables, lens, topk=topk)
    want = dsa_topk_paged_reference(q, w, pool, tables, lens, topk=topk)
    assert got.shape == want.shape
    for n in range(4):  # same sets (fp32 scores, no ties in random data)
        assert set(got[n].tolist()) == set(want[n].tolist()), f"row {n} selected other keys"


@pytest.mark.parametrize("topk", [5, 1000], ids=["k<ctx", "k>=ctx"])
def test_fp8_kernel_matches_reference(fast, device, topk):
    q, w, pool, tables, lens = _case([1, 20, 64, 90], 16, 4, 32, torch.float32, device, seed=7)
    keys, scales = _fp8_in_block(pool)
    got = fast.dsa.dsa_topk_paged_fast(q, w, keys, tables, lens, topk=topk, index_scales=scales)
    want = dsa_topk_paged_reference(q, w, keys, tables, lens, topk=topk, index_scales=scales)
    assert torch.equal(got, want), "fp8 keys: the kernel selected other keys than the reference"


def test_variable_k_per_row(fast, device):
    q, w, pool, tables, lens = _case([40, 20, 64, 90], 16, 4, 16, torch.float32, device, seed=3)
    k_rows = torch.tensor([3, 0, 64, 10], dtype=torch.int32, device=device)
    got = fast.dsa.dsa_topk_paged_fast(q, w, pool, tables, lens, topk=12, topk_rows=k_rows)
    want = dsa_topk_paged_reference(q, w, pool, tables, lens, topk=12, topk_rows=k_rows)
    assert torch.equal(got, want)
    assert (got >= 0).sum(1).tolist() == [3, 0, 12, 10]


def test_k_at_least_context_selects_every_key_and_equals_dense():
    q, w, pool, tables, lens = _case([30, 9], 16, 4, 16, torch.float32, "cpu", seed=2)
    idx = dsa_topk_paged(q, w, pool, tables, lens, topk=64)
    for n, length in enumerate(lens.tolist()):
        assert sorted(idx[n][idx[n] >= 0].tolist()) == list(range(length))
    g = torch.Generator().manual_seed(0)
    lat_pool, _, _ = paged_pool([30, 9], 16, tables.shape[1], 40, torch.float32, "cpu", 2)
    ql, qr = torch.randn(2, 4, 32, generator=g), torch.randn(2, 4, 8, generator=g)
    kw = dict(kv_lora_rank=32, scale=0.3)
    dense = mla_decode_paged_reference(ql, qr, lat_pool, tables, lens, **kw)
    sparse = mla_decode_paged_reference(ql, qr, lat_pool, tables, lens, indices=idx, **kw)
    assert_rel(sparse, dense, 1e-6, "DSA k >= context vs dense")


def test_dense_key_wrapper_marks_short_rows_invalid():
    q, w, pool, tables, _lens = _case([12], 16, 4, 16, torch.float32, "cpu", seed=5)
    keys = pool.view(-1, 16)[paged_rows(tables, torch.arange(12)[None], 16)[0]]
    idx, valid = dsa_topk_indices(q.expand(12, -1, -1), keys, w.expand(12, -1), 0, 5)
    assert idx.shape == (12, 5) and valid.sum(1).tolist() == [1, 2, 3, 4] + [5] * 8


def _prefill_rows(lens, chunk):
    """Prefill rows: the last `chunk[i]` positions of sequence i, in runs per sequence (as the model's
    DSA prefill passes them): `(seq_lens [T], table_rows [T])`."""
    seq_lens = torch.cat([torch.arange(n - c, n) + 1 for n, c in zip(lens, chunk, strict=True)])
    rows = torch.cat([torch.full((c,), i) for i, c in enumerate(chunk)])
    return seq_lens.to(torch.int32), rows


@pytest.mark.parametrize("group", [2, 4])
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8"])
def test_multi_row_prefill_scores_equal_the_single_row_kernel(fast, device, group, fp8):
    """The prefill scorer (one key-tile read for `group` rows) gives the single-row kernel's scores
    bit for bit, also in groups that straddle two sequences (3 + 5 + 2 rows: groups of 4 and 2
    cross each boundary) and in a last, partial group."""
    lens, chunk = [37, 70, 20], [3, 5, 2]
    _, _, pool, tables, _ = _case(lens, 16, 4, 32, torch.float32, device, seed=group)
    seq_lens, rows = _prefill_rows(lens, chunk)
    seq_lens, rows = seq_lens.to(device), rows.to(device)
    g = torch.Generator(device).manual_seed(9)
    q = torch.randn(len(rows), 4, 32, generator=g, device=device)
    w = torch.randn(len(rows), 4, generator=g, device=device)
    keys, scales = _fp8_in_block(pool) if fp8 else (pool, None)
    s = tables.shape[1] * 16
    one, many = (torch.full((len(rows), s), 7.0, device=device) for _ in range(2))
    kw = dict(index_scales=scales, table_rows=rows)
    fast.dsa.dsa_scores_fast(q, w, keys, tables, seq_lens, one, 0, **kw)
    fast.dsa.dsa_scores_fast(q, w, keys, tables, seq_lens, many, 0, rows_per_program=group, **kw)
    visible = torch.arange(s, device=device)[None, :] < seq_lens[:, None]
    assert torch.equal(one[visible], many[visible]), "multi-row scores differ from the single-row kernel"
    if fp8:  # the interpreter's e4m3 rounding of the queries is not torch's (the single-row
        # kernel's scores, equal to these, are held to the fp8 reference on the H200)
        return
    want = dsa_scores_reference(q, w, keys, tables[rows], seq_lens, scales)
    assert_rel(many[visible], want[visible], 1e-5, f"multi-row prefill scores (rows {group})")
    got = fast.dsa.dsa_topk_paged_fast(
        q, w, keys, tables, seq_lens, topk=6, table_rows=rows, rows_per_program=group
    )
    assert torch.equal(got, dsa_topk_paged_reference(q, w, keys, tables, seq_lens, topk=6, table_rows=rows))


def test_multi_row_rejects_other_group_sizes(fast, device):
    q, w, pool, tables, lens = _case([5], 16, 4, 16, torch.float32, device)
    out = torch.empty(1, tables.shape[1] * 16, device=device)
    with pytest.raises(ValueError, match="rows_per_program"):
        fast.dsa.dsa_scores_fast(q, w, pool, tables, lens, out, 0, table_rows=lens * 0, rows_per_program=3)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize(("lens", "chunk"), [([131072], [4096]), ([70000, 3000, 9000], [1023, 3000, 1])],
                         ids=["128k-chunk4k", "ragged-3-seqs"])  # fmt: skip
def test_gpu_multi_row_prefill_scores(fast, fp8, lens, chunk):
    """H200: the 4-row prefill scorer against the single-row kernel and the fp32 reference on a
    sample of rows."""
    dev = torch.device("cuda")
    _, _, pool, tables, _ = _case(lens, 64, 64, 128, torch.bfloat16, dev, seed=len(lens))
    seq_lens, rows = (t.to(dev) for t in _prefill_rows(lens, chunk))
    g = torch.Generator(dev).manual_seed(4)
    q = torch.randn(len(rows), 64, 128, generator=g, device=dev).to(torch.bfloat16)
    w = torch.randn(len(rows), 64, generator=g, device=dev) * 64**-0.5
    keys, scales = _fp8_in_block(pool) if fp8 else (pool, None)
    s = tables.shape[1] * 64
    one, many = (torch.empty(len(rows), s, device=dev) for _ in range(2))
    kw = dict(index_scales=scales, table_rows=rows)
    fast.dsa.dsa_scores_fast(q, w, keys, tables, seq_lens, one, 0, **kw)
    fast.dsa.dsa_scores_fast(q, w, keys, tables, seq_lens, many, 0, rows_per_program=4, **kw)
    visible = torch.arange(s, device=dev)[None, :] < seq_lens[:, None]
    # the same dot per row and key tile; the compiler may order the MMA's accumulation differently
    assert_rel(
        many[visible], one[visible], 1e-4, f"gpu multi-row prefill scores {lens} vs the single-row kernel"
    )
    sample = torch.linspace(0, len(rows) - 1, 16, device=dev).long()
    want = dsa_scores_reference(q[sample], w[sample], keys, tables[rows[sample]], seq_lens[sample], scales)
    vis = visible[sample]
    assert_rel(many[sample][vis], want[vis], 2e-2, f"gpu multi-row prefill scores {'fp8' if fp8 else 'bf16'}")


def test_dispatch_rejects_bad_input():
    q, w, pool, tables, lens = _case([5], 16, 4, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="topk"):
        dsa_topk_paged(q, w, pool, tables, lens, topk=0)
    with pytest.raises(ValueError, match="index_pool"):
        dsa_topk_paged(q, w, pool[..., :8], tables, lens, topk=4)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [2048, 1 << 18], ids=["k2048", "k>=ctx"])
@pytest.mark.parametrize(
    ("lens", "page"),
    [([131072], 64), ([131072] * 4 + [100, 5000, 2048, 2049], 64), ([3000] * 32, 16)],
    ids=["b1-128k", "b8-ragged", "b32-3k-page16"],
)
def test_gpu_topk_is_a_valid_selection(fast, lens, page, topk):
    dev = torch.device("cuda")
    q, w, pool, tables, seq_lens = _case(lens, page, 64, 128, torch.bfloat16, dev, seed=len(lens))
    idx = fast.dsa.dsa_topk_paged_fast(q, w, pool, tables, seq_lens, topk=topk)
    _assert_valid_topk(
        idx, _scores(q, w, pool, tables, seq_lens), seq_lens, topk, 1e-2, f"gpu topk {len(lens)}"
    )
    assert idx.shape == (len(lens), min(topk, tables.shape[1] * page))
    if topk >= max(lens):  # k >= context: exactly every visible key
        for n, length in enumerate(lens):
            assert torch.equal(idx[n][idx[n] >= 0].sort().values, torch.arange(length, device=dev))


@pytest.mark.gpu
def test_gpu_fp8_indexer_recall_of_the_bf16_selection(fast):
    """FP8 keys (and queries) vs bf16 keys at batch 32 x 128K, top-2048: the share of the bf16
    selection the FP8 indexer keeps (random data: score gaps at the threshold are small)."""
    dev = torch.device("cuda")
    lens = [131072] * 32
    q, w, pool, tables, seq_lens = _case(lens, 64, 64, 128, torch.bfloat16, dev, seed=11)
    keys, scales = _fp8_in_block(pool)
    got = fast.dsa.dsa_topk_paged_fast(q, w, keys, tables, seq_lens, topk=2048, index_scales=scales)
    # fp8 MMAs accumulate in another order than the reference's fp32 einsum: near-tied keys at the
    # threshold may swap, so each row must be a top-2048 of the reference's fp8 scores up to 1e-3
    # of the row's score range (the bf16 path is held to 1e-2 above)
    _assert_valid_topk(got, dsa_scores_reference(q, w, keys, tables, seq_lens, scales), seq_lens, 2048, 1e-3,
                       "gpu fp8 topk vs fp8 reference scores")  # fmt: skip
    bf16 = fast.dsa.dsa_topk_paged_fast(q, w, pool, tables, seq_lens, topk=2048)
    recall = sum(torch.isin(got[n], bf16[n]).float().mean().item() for n in range(len(lens))) / len(lens)
    ERRORS.append({"case": "gpu fp8 indexer b32 x 128K k2048: 1 - recall of the bf16 top-2048",
                   "max_abs_err": 1 - recall, "rel_err": 1 - recall, "tol": 0.1, "passed": recall >= 0.9})  # fmt: skip
    write_error_table()
    assert recall >= 0.9, f"the fp8 indexer kept {recall:.3f} of the bf16 top-2048"
