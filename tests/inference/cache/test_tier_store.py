"""The tensor side of the tiers (`engine/tier_store.py`): units stored to the host and disk tiers
and loaded back are bit-identical (bf16 and FP8 latents with scales, indexer keys, fp32 states),
host -> disk moves keep the bytes, and a promotion is reported only once its data has landed (on
CUDA it runs on a side stream and overlaps work queued on the compute stream)."""

import random
import threading
import time

import pytest
import torch

from inference.cache.tiers import BLOCK, DISK, HOST, STATE, Drop, Load, Move, Store, TierCapacity, Transfer
from inference.engine.tier_store import TierStore
from inference.model.cache_tensors import HybridCacheSpec, HybridCacheTensors

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def cache(device, fp8=False, blocks=12, slots=4):
    spec = HybridCacheSpec(
        mla_layers=(1, 3), kda_layers=(0, 2), latent_dim=24, index_head_dim=8, kda_num_heads=2,
        kda_head_dim=8, conv_channels=48, conv_window=3, kv_dtype_bytes=2, latent_fp8=fp8,
    )  # fmt: skip
    c = HybridCacheTensors.allocate(spec, blocks, 4, slots, device, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    for pools in (c.kv, c.kv_scale, c.index_k, c.state, c.conv):
        for t in pools.values():
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return c


def snapshot(c):
    return {
        (name, i): t.clone()
        for name, pools in [
            ("kv", c.kv),
            ("s", c.kv_scale),
            ("ik", c.index_k),
            ("st", c.state),
            ("cv", c.conv),
        ]
        for i, t in pools.items()
    }


def same(a, b, name, i, idx_a, idx_b):
    return torch.equal(a[(name, i)][idx_a].view(torch.uint8), b[(name, i)][idx_b].view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_store_move_load_roundtrip_bit_identical(device, fp8, tmp_path):
    c = cache(device, fp8)
    before = snapshot(c)
    store = TierStore(c, TierCapacity(host_blocks=4, host_states=2, disk_bytes=1 << 20), str(tmp_path))
    store.apply([
        Store(BLOCK, 5, HOST, 0), Store(BLOCK, 2, HOST, 1), Store(BLOCK, 7, HOST, 3), Store(STATE, 1, HOST, 1),
        Store(BLOCK, 9, DISK, 1), Store(STATE, 3, DISK, 2), Move(BLOCK, 1, 3),
    ])  # fmt: skip
    for pools in (c.kv, c.kv_scale, c.index_k, c.state, c.conv):  # the GPU copies are gone
        for t in pools.values():
            t.zero_()
    store.start([
        Transfer(0, (Load(BLOCK, HOST, 0, 0), Load(BLOCK, HOST, 3, 1), Load(STATE, HOST, 1, 0))),
        Transfer(1, (Load(BLOCK, DISK, 1, 4), Load(BLOCK, DISK, 3, 6), Load(STATE, DISK, 2, 2))),
    ])  # fmt: skip
    done = []
    while len(done) < 2:
        done += store.poll(wait=True)
    assert sorted(done) == [0, 1] and store.num_pending == 0
    after = snapshot(c)
    for i in c.kv:
        for name in ("kv", "ik") + (("s",) if fp8 else ()):
            for src, dst in [(5, 0), (7, 1), (9, 4), (2, 6)]:  # 2 went host -> disk (Move)
                assert same(before, after, name, i, src, dst), (name, i, src, dst)
    for i in c.state:
        for name in ("st", "cv"):
            assert same(before, after, name, i, 1, 0) and same(before, after, name, i, 3, 2)
    store.close()


@pytest.mark.gpu
def test_promotion_runs_on_a_side_stream_and_overlaps():
    c = cache("cuda", blocks=64)
    store = TierStore(c, TierCapacity(host_blocks=64, host_states=0, disk_bytes=0))
    store.apply([Store(BLOCK, b, HOST, b) for b in range(64)])
    torch.cuda.synchronize()
    assert store.stream is not None and store.stream != torch.cuda.current_stream()
    store.start([Transfer(7, tuple(Load(BLOCK, HOST, b, b) for b in range(64)))])
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(100):  # the step's forward, queued after the promotion on the compute stream
        a = a @ a / 128
    got = []
    while not got:
        got = store.poll()
    assert got == [7]
    # it landed while the compute stream was still busy: the copy overlapped the forward
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_a_host_location_reused_right_after_its_move_keeps_both_contents(device, tmp_path):
    """A move queues the taking of its host bytes on the copy thread; a store reusing that host
    location in the same step waits for them, so the file holds the old unit and the host the new."""
    c = cache(device)
    before = snapshot(c)
    store = TierStore(c, TierCapacity(host_blocks=1, host_states=0, disk_bytes=1 << 20), str(tmp_path))
    store.apply([Store(BLOCK, 5, HOST, 0), Move(BLOCK, 0, 9), Store(BLOCK, 2, HOST, 0)])
    store.start([Transfer(0, (Load(BLOCK, DISK, 9, 0), Load(BLOCK, HOST, 0, 1)))])
    while not store.poll(wait=True):
        pass
    after = snapshot(c)
    for i in c.kv:
        assert same(before, after, "kv", i, 5, 0) and same(before, after, "kv", i, 2, 1)
    store.close()


def test_moves_do_not_wait_on_the_engine_thread(tmp_path):
    """`apply` of a move returns while the copy thread is still busy: the bytes are taken there."""
    import threading

    c = cache("cpu")
    store = TierStore(c, TierCapacity(host_blocks=2, host_states=0, disk_bytes=1 << 20), str(tmp_path))
    store.apply([Store(BLOCK, 3, HOST, 1)])
    gate = threading.Event()
    store._copier.submit(gate.wait)  # the copy thread is busy until the gate opens
    store.apply([Move(BLOCK, 1, 4)])  # returns at once
    assert store.num_writes_in_flight == 1 and not (tmp_path / "kv-4.bin").exists()
    gate.set()
    store.flush()
    assert (tmp_path / "kv-4.bin").stat().st_size == store.unit_bytes[BLOCK]
    store.close()


def test_every_tensor_the_cache_holds_moves_with_its_unit(tmp_path):
    """The tier store finds the cache's pools from its fields: a pool added later (here an extra
    per-block tensor of each MLA layer) round-trips with the rest, without a change here."""
    from dataclasses import dataclass, field

    @dataclass
    class Extended(HybridCacheTensors):
        extra: dict = field(default_factory=dict)

    base = cache("cpu")
    c = Extended(
        **{f: getattr(base, f) for f in ("spec", "block_size", "kv", "kv_scale", "index_k", "state", "conv")}
    )
    c.extra = {i: torch.randn(12, 4, 3) for i in c.kv}
    want = {i: t[5].clone() for i, t in c.extra.items()}
    store = TierStore(c, TierCapacity(host_blocks=2, host_states=0, disk_bytes=1 << 20), str(tmp_path))
    store.apply([Store(BLOCK, 5, HOST, 0), Store(BLOCK, 5, DISK, 3)])
    for t in c.extra.values():
        t.zero_()
    store.start([Transfer(0, (Load(BLOCK, HOST, 0, 1), Load(BLOCK, DISK, 3, 2)))])
    while not store.poll(wait=True):
        pass
    for i, t in c.extra.items():
        assert torch.equal(t[1], want[i]) and torch.equal(t[2], want[i])
    store.close()


@pytest.mark.parametrize("device", DEVICES)
def test_a_disk_promotion_larger_than_the_staging_slabs_streams_through_them(device, tmp_path, monkeypatch):
    """Slabs of one unit each and two of them: a promotion of 10 blocks and 3 states cycles each
    slab five-plus times (each refill after its previous copy ran) and lands bit-identical; the
    slabs are allocated once, with the store."""
    import inference.engine.tier_store as ts

    monkeypatch.setattr(ts, "DISK_STAGING_BYTES", 1)
    monkeypatch.setattr(ts, "DISK_STAGING_SLABS", 2)
    c = cache(device, blocks=24, slots=8)
    before = snapshot(c)
    store = TierStore(c, TierCapacity(host_blocks=0, host_states=0, disk_bytes=1 << 24), str(tmp_path))
    assert store.slab_bytes == max(store.unit_bytes.values()) and len(store._slabs) == 2
    slabs = {t.data_ptr() for t, _ in store._slabs}
    store.apply(
        [Store(BLOCK, b, DISK, 100 + b) for b in range(10)]
        + [Store(STATE, s, DISK, 50 + s) for s in range(3)]
    )
    for pools in (c.kv, c.kv_scale, c.index_k, c.state, c.conv):
        for t in pools.values():
            t.zero_()
    loads = [Load(BLOCK, DISK, 100 + b, 23 - b) for b in range(10)] + [
        Load(STATE, DISK, 50 + s, 7 - s) for s in range(3)
    ]
    store.start([Transfer(0, tuple(loads))])
    while not store.poll(wait=True):
        pass
    after = snapshot(c)
    for i in c.kv:
        for b in range(10):
            assert same(before, after, "kv", i, b, 23 - b) and same(before, after, "ik", i, b, 23 - b), (i, b)
    for i in c.state:
        for s in range(3):
            assert same(before, after, "st", i, s, 7 - s) and same(before, after, "cv", i, s, 7 - s), (i, s)
    assert {t.data_ptr() for t, _ in store._slabs} == slabs  # the same two slabs, no new ones
    store.close()


def test_a_failed_disk_read_surfaces_in_poll_and_gives_its_slab_back(tmp_path):
    """A unit file gone missing fails its promotion in `poll` (the engine thread), and the slab
    it was read for goes back to the ring (a slab lost per failure would stall the loader)."""
    import inference.engine.tier_store as ts

    c = cache("cpu")
    store = TierStore(c, TierCapacity(host_blocks=0, host_states=0, disk_bytes=1 << 20), str(tmp_path))
    store.start([Transfer(0, (Load(BLOCK, DISK, 7, 0),))])  # location 7 was never stored
    with pytest.raises(FileNotFoundError, match="kv-7"):
        while not store.poll(wait=True):
            pass
    store._loader.submit(lambda: None).result()  # the loader is past the failed promotion
    assert len(store._slabs) == ts.DISK_STAGING_SLABS
    store.close()


@pytest.mark.parametrize("device", DEVICES)
def test_a_promotion_reads_past_the_writes_queued_before_it(device, tmp_path, monkeypatch):
    """Reads have threads of their own: a returning conversation's files are read while the
    writes of what its return evicts are still queued (they used to wait behind every one of
    those writes, ~1 s of a 128K return from disk)."""
    c = cache(device)
    store = TierStore(c, TierCapacity(host_blocks=0, host_states=0, disk_bytes=1 << 22), str(tmp_path))
    store.apply([Store(BLOCK, 0, DISK, 7)])
    store.flush()
    before = snapshot(c)
    gate = threading.Event()
    write = store._write_file
    monkeypatch.setattr(store, "_write_file", lambda path, data: (gate.wait(30), write(path, data)))
    store.apply([Store(BLOCK, b, DISK, 20 + b) for b in range(1, 12)])  # all writers held
    store.start([Transfer(0, (Load(BLOCK, DISK, 7, 11),))])
    t0 = time.monotonic()
    done: list[int] = []
    while not done and time.monotonic() - t0 < 10:
        done = store.poll()
        time.sleep(0.01)
    written = [(tmp_path / f"kv-{20 + b}.bin").exists() for b in range(1, 12)]
    gate.set()
    assert done == [0] and not any(written)
    store.flush()
    assert all((tmp_path / f"kv-{20 + b}.bin").exists() for b in range(1, 12))
    after = snapshot(c)
    for i in c.kv:
        assert same(before, after, "kv", i, 0, 11) and same(before, after, "ik", i, 0, 11), i
    store.close()


def test_a_failed_read_mid_promotion_releases_the_readers_of_the_units_after_it(tmp_path, monkeypatch):
    """Slabs of one unit: the fourth of ten files is missing. The promotion fails in `poll` with
    that file's error, every slab is back in the ring, and the readers of the six units never
    reached stop waiting for a slab row (closing the store would hang otherwise)."""
    import inference.engine.tier_store as ts

    monkeypatch.setattr(ts, "DISK_STAGING_BYTES", 1)
    c = cache("cpu", blocks=24)
    store = TierStore(c, TierCapacity(host_blocks=0, host_states=0, disk_bytes=1 << 24), str(tmp_path))
    store.apply([Store(BLOCK, b, DISK, 100 + b) for b in range(10) if b != 3])
    store.start([Transfer(0, tuple(Load(BLOCK, DISK, 100 + b, 23 - b) for b in range(10)))])
    with pytest.raises(FileNotFoundError, match="kv-103"):
        while not store.poll(wait=True):
            pass
    store._loader.submit(lambda: None).result()
    assert len(store._slabs) == ts.DISK_STAGING_SLABS
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_op_sequences_load_what_a_model_of_the_tiers_holds(device, seed, tmp_path, monkeypatch):
    """Random steps of stores (reusing locations, also a host location moved in the same step),
    host -> disk moves, deletes and promotions left in flight across steps (their locations kept,
    as the bookkeeping pins them), with one-unit slabs so every store and promotion spans many
    chunks: every promotion lands the bytes a dict model of the tiers says the location held."""
    import inference.engine.tier_store as ts

    monkeypatch.setattr(ts, "DISK_STAGING_BYTES", 1)
    rng = random.Random(seed)
    c = cache(device, blocks=24, slots=8)
    store = TierStore(c, TierCapacity(host_blocks=6, host_states=3, disk_bytes=1 << 24), str(tmp_path))
    units = {BLOCK: 24, STATE: 8}
    locs = {(BLOCK, HOST): 6, (STATE, HOST): 3, (BLOCK, DISK): 10, (STATE, DISK): 5}
    model: dict[tuple[int, int, int], bytes] = {}  # (kind, tier, loc) -> the unit's bytes
    busy: dict[int, set[int]] = {BLOCK: set(), STATE: set()}  # GPU units a promotion will write
    inflight: dict[int, list[tuple[int, int, bytes]]] = {}
    pinned: dict[int, list[tuple[int, int, int]]] = {}  # promotion -> the locations it reads

    def unit(kind: int, u: int) -> bytes:
        return b"".join(bytes(g[u].cpu().numpy()) for g in store.gpu[kind])

    def check(ids: list[int]) -> None:
        for tid in ids:
            for kind, u, want in inflight.pop(tid):
                assert unit(kind, u) == want, (seed, tid, kind, u)
                busy[kind].discard(u)
            del pinned[tid]

    for step in range(40):
        for kind in (BLOCK, STATE):  # new contents for the free GPU units
            for u in set(range(units[kind])) - busy[kind]:
                for g in store.gpu[kind]:
                    g[u].copy_(torch.randint(0, 256, g[u].shape, dtype=torch.uint8))
        ops: list = []
        for _ in range(rng.randrange(1, 8)):
            kind, tier = rng.choice([BLOCK, STATE]), rng.choice([HOST, DISK])
            free = [u for u in range(units[kind]) if u not in busy[kind]]
            held = [loc for (k, t, loc) in model if k == kind and t == HOST]
            what = rng.choice(["store", "store", "move", "drop"])
            if what == "store" and free:
                u, loc = rng.choice(free), rng.randrange(locs[(kind, tier)])
                if any(isinstance(o, Move) and o.kind == kind and tier == HOST and o.src == loc for o in ops):
                    continue  # a step's move and a store reusing its host location: kept apart here
                ops.append(Store(kind, u, tier, loc))
                model[(kind, tier, loc)] = unit(kind, u)
            elif what == "move" and held:
                src, dst = rng.choice(held), rng.randrange(locs[(kind, DISK)])
                ops.append(Move(kind, src, dst))
                model[(kind, DISK, dst)] = model.pop((kind, HOST, src))
            elif (
                what == "drop"
                and (kind, DISK)
                and (on := [lc for (k, t, lc) in model if k == kind and t == DISK])
            ):
                loc = rng.choice(on)
                ops.append(Drop(kind, loc))
                del model[(kind, DISK, loc)]
        store.apply(ops)
        loads, expect = [], []
        for (kind, tier, loc), data in rng.sample(sorted(model.items()), min(4, len(model))):
            free = [u for u in range(units[kind]) if u not in busy[kind]]
            if free:
                u = rng.choice(free)
                busy[kind].add(u)
                loads.append(Load(kind, tier, loc, u))
                expect.append((kind, u, data))
        if loads:
            store.start([Transfer(step, tuple(loads))])
            inflight[step] = expect
            pinned[step] = [(ld.kind, ld.tier, ld.loc) for ld in loads]
        check(store.poll())
    while inflight:
        check(store.poll(wait=True))
    store.close()


@pytest.mark.parametrize("where", ["local", "memory-url"])
@pytest.mark.parametrize("cut", [1, -1], ids=["truncated", "grown"])
def test_a_unit_file_of_the_wrong_size_fails_its_promotion_saying_so(tmp_path, cut, where):
    """A unit file cut short or grown in the tier (a foreign write, a full disk) is refused, never
    copied in part: the promotion fails in `poll` naming the file and both sizes (local files
    and fsspec URLs take different read paths)."""
    url = str(tmp_path) if where == "local" else f"memory://dayzero-kv/{tmp_path.name}"
    c = cache("cpu")
    store = TierStore(c, TierCapacity(host_blocks=0, host_states=0, disk_bytes=1 << 20), url)
    store.apply([Store(BLOCK, 0, DISK, 7)])
    store.flush()
    path = store._path(BLOCK, 7)
    data = store.fs.cat_file(path)
    store.fs.pipe_file(path, data[:-cut] if cut > 0 else data + b"\0")
    store.start([Transfer(0, (Load(BLOCK, DISK, 7, 1),))])
    with pytest.raises(OSError, match=rf"kv-7.bin has {len(data) - cut} bytes .* expected {len(data)}"):
        while not store.poll(wait=True):
            pass
    store.close()
