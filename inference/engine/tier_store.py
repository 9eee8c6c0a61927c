"""The tensor side of the offload tiers: pinned host pools, a disk/fsspec store, and the copies
`inference/cache/tiers.py` orders (stores, host->disk moves, deletes, asynchronous promotions).

A unit is one KV block (the rows of every tensor the cache holds per block: MLA latents, their
FP8 scales, indexer keys, found generically by `_unit_tensors`) or one state slot (every KDA
layer's recurrent state and conv window). On the host each tensor group has one pinned pool
`[locations, bytes per unit]`; on disk a unit is one file of its groups' bytes.

Ordering (why it is safe): `apply` runs at the very start of a step, on the compute stream, before
any write of the step, so a block evicted in this step's scheduling is read before its new owner
writes it. Promotions then run on a side stream that first waits for the compute stream (their
targets may be the blocks just stored) and records an event; `poll` reports a transfer once its
event has completed, and only then may the scheduler admit the request that needs it.

Copies (how it is fast): a promotion's units whose host locations and GPU blocks are both
consecutive (the promoter assigns targets in location order) go straight into the pool, one copy
per run and tensor group; the rest through a device staging buffer and one scatter.

Disk (off the engine thread): a unit is one file of its groups' bytes. A host -> disk move has
its bytes taken on a copy thread after the event of the device -> host copy that filled its host
rows (a store reusing that location waits only for those bytes). A GPU -> disk store is gathered
unit-contiguous on the device; the copy thread streams it through one pinned out-slab on its own
stream and the store writers write the files straight from the slab's rows (no page-locked
allocation per eviction, no bytes copied in Python). A promotion's reads go straight into the
rows of the pinned slabs it streams through, on reader threads of their own, so a returning
conversation never queues behind the writes of the one its return evicts. The many units of a
store or a promotion are registered a slab's worth at a time, in `DISK_THREADS` parts, not one
future each. Every file operation runs after the operations registered before it on the same
file (a read or delete after the write of its own file, never after other files'; `fulfil_after`
says why that cannot deadlock). The scheduler's bookkeeping is final when it emits the ops:
these orderings make every later op on the same location see it done. On a CPU the host copies
are synchronous; the rest is the same.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import partial

import numpy as np
import torch

from inference.cache.tiers import BLOCK, DISK, HOST, STATE, Drop, Load, Move, Store, TierCapacity, Transfer
from inference.engine.tier_files import DISK_THREADS, TierFiles, fulfil_after, split_parts
from inference.model.cache_tensors import HybridCacheTensors

DIRECT_MIN = 8  # units: a shorter run is cheaper through the staging buffer (one copy per host run)
# A promotion from disk streams through a fixed ring of pinned slabs (allocated once, with the
# store), not a pinned buffer the size of the promotion: that was a fresh page-locked allocation
# of every returning conversation's bytes (604 MB at 128K, 4.7 GB at 1M) inside its TTFT, and
# pinned memory without a bound. While one slab's host-to-device copy runs, the next is filled.
DISK_STAGING_BYTES = 32 << 20  # one slab (at least one unit)
DISK_STAGING_SLABS = 4


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A pool `[N, ...]` as `[N, bytes per row]` uint8 (a view: writes go to the pool)."""
    return t.view(torch.uint8).view(t.shape[0], -1)


def _unit_tensors(cache: HybridCacheTensors) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every pool the cache holds, split by unit: a tensor of an MLA layer is indexed by KV block,
    one of a KDA layer by state slot. Generic over the cache's fields (latents, their scales,
    indexer keys and whatever is added later), so nothing the cache holds is left behind."""
    mla, kda = set(cache.spec.mla_layers), set(cache.spec.kda_layers)
    kv: list[torch.Tensor] = []
    st: list[torch.Tensor] = []
    for f in fields(cache):
        pools = getattr(cache, f.name)
        if not isinstance(pools, dict):
            continue
        for layer, t in sorted(pools.items()):
            if not isinstance(t, torch.Tensor):
                continue
            if layer in mla:
                kv.append(t)
            elif layer in kda:
                st.append(t)
            else:
                raise ValueError(f"cache tensor {f.name}[{layer}] belongs to no MLA or KDA layer")
    return kv, st


def _runs(locs: list[int]) -> list[tuple[int, int, int]]:
    """Consecutive runs of sorted locations as (position in list, first location, length)."""
    out: list[tuple[int, int, int]] = []
    for i, loc in enumerate(locs):
        if out and out[-1][1] + out[-1][2] == loc:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((i, loc, 1))
    return out


@dataclass(slots=True)
class _Pending:
    transfer: Transfer
    event: object | None  # torch.cuda.Event, or None when already done
    future: Future | None  # disk reads in progress
    nbytes: int
    started: float


class TierStore(TierFiles):
    """Host pools, disk files (`TierFiles`) and the copy engine for one `HybridCacheTensors`."""

    def __init__(self, cache: HybridCacheTensors, capacity: TierCapacity, disk_url: str = "") -> None:
        self.cache = cache
        kv, st = _unit_tensors(cache)
        self.gpu = {BLOCK: [_rows(t) for t in kv], STATE: [_rows(t) for t in st]}
        self.device = kv[0].device if kv else st[0].device
        cuda = self.device.type == "cuda"
        n = {BLOCK: capacity.host_blocks, STATE: capacity.host_states}
        self.host = {
            k: [torch.empty((n[k], g.shape[1]), dtype=torch.uint8, pin_memory=cuda) for g in groups]
            for k, groups in self.gpu.items()
        }
        self.unit_bytes = {k: sum(g.shape[1] for g in groups) for k, groups in self.gpu.items()}
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        disk = bool(capacity.disk_bytes)
        self._init_files(capacity.disk_bytes, disk_url)
        # the copy thread: takes the bytes of units bound for disk (off the engine thread), from
        # the device through its own slab on its own stream
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-copy") if disk else None
        self._out_stream = torch.cuda.Stream(self.device) if cuda and disk else None
        # the loader: waits for a promotion's file reads, then copies them to the GPU (in order)
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-load") if disk else None
        # its slabs, each with the event after which it may be refilled (only the loader uses them)
        self.slab_bytes = max(DISK_STAGING_BYTES, *self.unit_bytes.values())
        self._slabs: deque[tuple[torch.Tensor, object | None]] = deque(
            (torch.empty(self.slab_bytes, dtype=torch.uint8, pin_memory=cuda), None)
            for _ in range(DISK_STAGING_SLABS if disk else 0)
        )
        self._out_slab = torch.empty(
            self.slab_bytes if cuda and disk else 0, dtype=torch.uint8, pin_memory=cuda
        )
        self._pending: list[_Pending] = []
        self._host_reads: dict[tuple[int, int], Future] = {}  # host location -> a move taking it
        self._host_event = None  # marks the last device -> host store (a move reads after it)
        self.num_moves = 0
        # finished promotions: (bytes, seconds from `start` to the poll that saw them land)
        self.transfer_times: deque[tuple[int, float]] = deque(maxlen=256)
        self.bytes_loaded = {HOST: 0, DISK: 0}
        self.bytes_stored = {HOST: 0, DISK: 0}

    def _batches(self, kind: int, paths: list[str]) -> list[list[tuple[range, Future, list]]]:
        """Register one operation per part of each slab's worth of `paths` (a chunk, split into
        `DISK_THREADS` parts run in parallel): `[chunk][part] = (indices, future, previous ops)`.
        A 128K conversation is 2,048 units: per-unit futures and submissions from the engine
        thread cost ~0.5 s of its return's TTFT (the Python work of 4,000 of them, contended)."""
        # a unit of 0 bytes: a pipeline stage without paged (or recurrent) layers moves nothing
        per = max(1, self.slab_bytes // max(1, self.unit_bytes[kind]))
        chunks = []
        for b0 in range(0, len(paths), per):
            parts = []
            for q in split_parts(range(b0, min(b0 + per, len(paths))), DISK_THREADS):
                fut: Future = Future()
                parts.append((q, fut, self._register([paths[i] for i in q], fut)))
            chunks.append(parts)
        return chunks

    def _store_from(self, units: torch.Tensor, event, paths: list[str], chunks: list) -> None:
        """On the copy thread: write the unit files of `units` (`[n, unit bytes]`, on the device or
        the host), a chunk at a time: on CUDA through the pinned out-slab on the copy stream once
        `event` (the gather on the compute stream) has run, then straight from the slab's rows on
        the store writers, which the slab waits for before its next chunk."""
        sent = 0
        try:
            if self._out_stream is not None:
                self._out_stream.wait_event(event)
            for parts in chunks:
                b0, b1 = parts[0][0].start, parts[-1][0].stop
                if self._out_stream is not None:
                    rows = self._out_slab[: (b1 - b0) * units.shape[1]].view(b1 - b0, units.shape[1])
                    with torch.cuda.stream(self._out_stream):
                        rows.copy_(units[b0:b1], non_blocking=True)
                    self._out_stream.synchronize()
                    src, base = rows.numpy(), b0
                else:
                    src, base = units.numpy(), 0
                for q, fut, prevs in parts:
                    job = partial(self._write_files, [paths[i] for i in q], [src[i - base] for i in q])
                    self._store_io.submit(fulfil_after, fut, prevs, job)
                    sent += 1
                for _, fut, _ in parts:
                    fut.exception()  # waits: the slab is refilled next, its files are written
        except BaseException as e:  # the parts not sent fail, seen in `poll`
            for fut in [f for parts in chunks for _, f, _ in parts][sent:]:
                fut.set_exception(e)

    # -- ops in order ----------------------------------------------------------------------
    def apply(self, ops: list[Store | Move | Drop]) -> None:
        """Run the scheduler's tier ops in list order (consecutive stores are batched). Nothing
        here waits for the device or the disk on the engine thread, except a store into a host
        location whose previous bytes a queued move has not taken yet (a memcpy away)."""
        i = 0
        while i < len(ops):
            op = ops[i]
            if isinstance(op, Store):
                j = i
                while (
                    j < len(ops)
                    and isinstance(ops[j], Store)
                    and ops[j].kind == op.kind
                    and ops[j].tier == op.tier
                ):
                    j += 1
                self._store(op.kind, op.tier, ops[i:j])
                i = j
                continue
            if isinstance(op, Move):
                # the host rows are taken on the copy thread once the last host store has landed
                rows = [h[op.src] for h in self.host[op.kind]]
                taken = self._copier.submit(_take_bytes, rows, self._host_event)
                self._host_reads[(op.kind, op.src)] = taken  # the location is free once taken
                path = self._path(op.kind, op.dst)
                self._file_op(path, lambda path=path, taken=taken: self._write_file(path, taken.result()))
                self.bytes_stored[DISK] += self.unit_bytes[op.kind]
                self.num_moves += 1
            elif isinstance(op, Drop):
                path = self._path(op.kind, op.loc)
                self._file_op(path, lambda path=path: self.fs.rm_file(path))
            i += 1

    def _event(self, side: bool = False):
        """An event marking the work queued so far on the compute stream (`side`: on the
        promotions' side stream); None on a CPU."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream if side else torch.cuda.current_stream(self.device))
        return ev

    def _store(self, kind: int, tier: int, ops: list[Store]) -> None:
        ops = sorted(ops, key=lambda o: o.loc)
        idx = torch.tensor([o.gpu for o in ops], dtype=torch.int64, device=self.device)
        gathered = [g.index_select(0, idx) for g in self.gpu[kind]]  # contiguous, in location order
        if tier == HOST:
            for o in ops:  # a move still taking this location's old bytes must finish first
                if (taken := self._host_reads.pop((kind, o.loc), None)) is not None:
                    taken.result()
            for h, src in zip(self.host[kind], gathered, strict=True):
                for pos, loc, n in _runs([o.loc for o in ops]):
                    h[loc : loc + n].copy_(src[pos : pos + n], non_blocking=True)
            self._host_event = self._event()
            self.bytes_stored[HOST] += len(ops) * self.unit_bytes[kind]
        else:  # gathered unit-contiguous; written from the copy thread (`_store_from`)
            units = torch.cat(gathered, dim=1) if len(gathered) > 1 else gathered[0]
            paths = [self._path(kind, o.loc) for o in ops]
            self._copier.submit(self._store_from, units, self._event(), paths, self._batches(kind, paths))
            self.bytes_stored[DISK] += len(ops) * self.unit_bytes[kind]

    # -- promotions ------------------------------------------------------------------------
    def start(self, transfers: list[Transfer]) -> None:
        """Begin promotions (after `apply` of the same step: the side stream waits for it)."""
        for tr in transfers:
            nbytes = sum(self.unit_bytes[ld.kind] for ld in tr.loads)
            disk = [ld for ld in tr.loads if ld.tier == DISK]
            host = [ld for ld in tr.loads if ld.tier == HOST]
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
            event = self._load_host(host)
            future = self._start_disk(disk) if disk else None
            self._pending.append(_Pending(tr, event, future, nbytes, time.perf_counter()))
            self.bytes_loaded[HOST] += sum(self.unit_bytes[ld.kind] for ld in host)
            self.bytes_loaded[DISK] += sum(self.unit_bytes[ld.kind] for ld in disk)

    def _put(self, kind: int, srcs: list[torch.Tensor], rows: list[int], gpu_ids: list[int]) -> None:
        """Host rows `rows` of each group's host tensor in `srcs` into GPU units `gpu_ids` (pairwise),
        on the current stream. A run of at least `DIRECT_MIN` units consecutive on both sides is
        one copy straight into the pool; the other units are gathered into a device staging
        buffer (one copy per run of consecutive host rows) and scattered with one `index_copy_`."""
        pairs = sorted(zip(rows, gpu_ids, strict=True))
        direct: list[tuple[int, int, int]] = []  # (host row, gpu unit, length)
        rest: list[tuple[int, int]] = []
        i = 0
        while i < len(pairs):
            j = i + 1
            while (
                j < len(pairs) and pairs[j][0] == pairs[j - 1][0] + 1 and pairs[j][1] == pairs[j - 1][1] + 1
            ):
                j += 1
            if j - i >= DIRECT_MIN:
                direct.append((pairs[i][0], pairs[i][1], j - i))
            else:
                rest += pairs[i:j]
            i = j
        for g, h in zip(self.gpu[kind], srcs, strict=True):
            for r, u, n in direct:
                g[u : u + n].copy_(h[r : r + n], non_blocking=True)
        if not rest:
            return
        idx = torch.tensor([u for _, u in rest], dtype=torch.int64).to(self.device, non_blocking=True)
        host_runs = _runs([r for r, _ in rest])
        for g, h in zip(self.gpu[kind], srcs, strict=True):
            buf = torch.empty((len(rest), h.shape[1]), dtype=torch.uint8, device=self.device)
            for pos, r, n in host_runs:
                buf[pos : pos + n].copy_(h[r : r + n], non_blocking=True)
            g.index_copy_(0, idx, buf)

    def _load_host(self, loads: list[Load]):
        """Host -> GPU for one transfer on the side stream (`_put`). Returns the event marking its
        end (None on a CPU: done already)."""
        if not loads:
            return None
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else _nullctx()
        with ctx:
            for kind in (BLOCK, STATE):
                ls = [ld for ld in loads if ld.kind == kind]
                if ls:
                    self._put(kind, self.host[kind], [ld.loc for ld in ls], [ld.gpu for ld in ls])
            return self._event(side=True)

    def _start_disk(self, loads: list[Load]) -> Future:
        """Register a promotion's file reads now (in order with the writes and deletes of the same
        files, in parallel otherwise); the loader thread then reads them, a slab at a time, into
        the ring of pinned slabs and on to the GPU and into the pool (`_load_disk`)."""
        staged = []
        for kind in (BLOCK, STATE):
            ls = [ld for ld in loads if ld.kind == kind]
            if ls:
                paths = [self._path(kind, ld.loc) for ld in ls]
                staged.append((kind, ls, paths, self._batches(kind, paths)))
        return self._loader.submit(self._load_disk, staged)

    def _load_disk(self, staged: list) -> object:
        """On the loader thread: per chunk, a free slab, its units' files read into its rows by the
        readers, one copy of it to the device and `_put` from its per-group columns (device to
        device), on the side stream; the slab is free again once that has run. Returns the last
        event. After a failure, the reads not started fail too (a later operation on their files
        waits for them)."""
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else _nullctx()
        try:
            with ctx:
                for kind, ls, paths, chunks in staged:
                    for parts in chunks:
                        self._load_chunk(kind, ls, paths, parts)
                return self._event(side=True)
        finally:
            for *_, chunks in staged:
                for parts in chunks:
                    for _, fut, _ in parts:
                        if not fut.done():
                            fut.set_exception(OSError("not read: an earlier unit of its promotion failed"))

    def _load_chunk(self, kind: int, ls: list[Load], paths: list[str], parts: list) -> None:
        n = self.unit_bytes[kind]
        b0, b1 = parts[0][0].start, parts[-1][0].stop
        slab, ready = self._slabs.popleft()
        try:
            if ready is not None:
                ready.synchronize()  # its previous copy to the device has run
            rows = slab[: (b1 - b0) * n].view(b1 - b0, n)
            host = rows.numpy()
            for q, fut, prevs in parts:
                self._readers.submit(fulfil_after, fut, prevs, partial(self._read_rows, paths, host, q, b0))
            # every read into this slab has ended (none may write it once it is back in the
            # ring); the first error is raised, and seen in `poll`
            errors = [e for _, fut, _ in parts if (e := fut.exception()) is not None]
            if errors:
                raise errors[0]
            src = rows.to(self.device, non_blocking=True)
            cols, off = [], 0
            for g in self.gpu[kind]:
                cols.append(src[:, off : off + g.shape[1]])
                off += g.shape[1]
            self._put(kind, cols, list(range(b1 - b0)), [ls[i].gpu for i in range(b0, b1)])
        finally:  # back in the ring also after a failed read: free once its copies ran
            self._slabs.append((slab, self._event(side=True)))

    def _read_rows(self, paths: list[str], host: np.ndarray, q: range, b0: int) -> None:
        for i in q:
            self._read_into(paths[i], host[i - b0])

    def poll(self, wait: bool = False) -> list[int]:
        """Ids of the promotions whose data is on the GPU now (`wait`: block for at least one)."""
        if self._writes:
            done_ops = [f for f in self._writes if f.done()]
            self._writes = [f for f in self._writes if not f.done()]
            for f in done_ops:
                f.result()  # a failed disk write raises here, in the engine thread
            self._last_op = {p: f for p, f in self._last_op.items() if not f.done()}
        for loc in [loc for loc, f in self._host_reads.items() if f.done()]:
            del self._host_reads[loc]
        done, left = [], []
        for i, p in enumerate(self._pending):
            if wait and not done and i == 0:
                if p.future is not None:
                    p.future.result()
                if p.event is not None:
                    p.event.synchronize()
            if self._finished(p):
                done.append(p.transfer.id)
                self.transfer_times.append((p.nbytes, time.perf_counter() - p.started))
            else:
                left.append(p)
        self._pending = left
        return done

    @staticmethod
    def _finished(p: _Pending) -> bool:
        if p.future is not None:
            if not p.future.done():
                return False
            ev = p.future.result()  # raises a read error here, in the engine thread
            if ev is not None and not ev.query():
                return False
        return p.event is None or p.event.query()

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_writes_in_flight(self) -> int:
        """Disk writes and deletes queued or running on the worker thread."""
        return sum(not f.done() for f in self._writes)

    def close(self) -> None:
        """Finish queued disk work, then remove a temporary disk folder."""
        if self._loader is not None:
            self._loader.shutdown(wait=True)
        if self._copier is not None:
            self._copier.shutdown(wait=True)
        self._close_files()


def _take_bytes(rows: list[torch.Tensor], event) -> bytes:
    """One unit's bytes (its groups' rows back to back), once `event` (if any) has completed: one
    allocation and one copy (no zero-filled buffer copied into afterwards)."""
    if event is not None:
        event.synchronize()
    return b"".join(memoryview(r.numpy()) for r in rows)


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
