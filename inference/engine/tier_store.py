"""The tensor side of the offload tiers: pinned host pools, a disk/fsspec store, and the copies
`inference/cache/tiers.py` orders (stores, host->disk moves, deletes, asynchronous promotions).

A unit is one KV block (every MLA layer's latent rows, FP8 scales and indexer keys) or one state
slot (every KDA layer's recurrent state and conv window). On the host each tensor group has one
pinned pool `[locations, bytes per unit]`; on disk a unit is one file of its groups' bytes.

Ordering (why it is safe): `apply` runs at the very start of a step, on the compute stream, before
any write of the step, so a block evicted in this step's scheduling is read before its new owner
writes it. Promotions then run on a side stream that first waits for the compute stream (their
targets may be the blocks just stored) and records an event; `poll` reports a transfer once its
event has completed, and only then may the scheduler admit the request that needs it. On a CPU
the host copies are synchronous and disk reads run on a worker thread: the same interface.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import torch

from inference.cache.tiers import BLOCK, DISK, HOST, STATE, Drop, Load, Move, Store, TierCapacity, Transfer
from inference.model.cache_tensors import HybridCacheTensors


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A pool `[N, ...]` as `[N, bytes per row]` uint8 (a view: writes go to the pool)."""
    return t.view(torch.uint8).view(t.shape[0], -1)


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


class TierStore:
    """Host pools, disk files and the copy engine for one `HybridCacheTensors`."""

    def __init__(self, cache: HybridCacheTensors, capacity: TierCapacity, disk_url: str = "") -> None:
        self.cache = cache
        kv = [*cache.kv.values(), *cache.kv_scale.values(), *cache.index_k.values()]
        st = [*cache.state.values(), *cache.conv.values()]
        self.gpu = {BLOCK: [_rows(t) for t in kv], STATE: [_rows(t) for t in st]}
        self.device = kv[0].device if kv else st[0].device
        cuda = self.device.type == "cuda"
        n = {BLOCK: capacity.host_blocks, STATE: capacity.host_states}
        self.host = {
            k: [torch.empty((n[k], g.shape[1]), dtype=torch.uint8, pin_memory=cuda) for g in groups]
            for k, groups in self.gpu.items()
        }
        self.unit_bytes = {k: sum(g.shape[1] for g in groups) for k, groups in self.gpu.items()}
        self._tmp = None
        if capacity.disk_bytes:
            if not disk_url:
                self._tmp = tempfile.TemporaryDirectory(prefix="dayzero-kv-")
                disk_url = self._tmp.name
            self.fs, self.root = fsspec.core.url_to_fs(disk_url)
            self.fs.makedirs(self.root, exist_ok=True)
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-read") if capacity.disk_bytes else None
        self._pending: list[_Pending] = []
        self._writes: list[Future] = []  # disk writes and deletes queued on the worker thread
        self.bytes_loaded = {HOST: 0, DISK: 0}
        self.bytes_stored = {HOST: 0, DISK: 0}

    # -- disk ------------------------------------------------------------------------------
    def _path(self, kind: int, loc: int) -> str:
        return f"{self.root}/{'kv' if kind == BLOCK else 'state'}-{loc}.bin"

    def _write(self, kind: int, loc: int, rows: list[torch.Tensor]) -> None:
        """One unit's group rows (CPU uint8) as one file. The bytes are copied now; the file is
        written on the worker thread, whose FIFO order puts it before any later read or delete."""
        data = b"".join(r.numpy().tobytes() for r in rows)
        self._writes.append(self._pool.submit(self.fs.pipe_file, self._path(kind, loc), data))
        self.bytes_stored[DISK] += self.unit_bytes[kind]

    def _read(self, kind: int, locs: list[int]) -> list[torch.Tensor]:
        """Units from disk as one pinned `[len(locs), bytes]` tensor per group."""
        groups = self.gpu[kind]
        out = [torch.empty((len(locs), g.shape[1]), dtype=torch.uint8, pin_memory=self.stream is not None)
               for g in groups]  # fmt: skip
        for i, loc in enumerate(locs):
            data = torch.frombuffer(bytearray(self.fs.cat_file(self._path(kind, loc))), dtype=torch.uint8)
            off = 0
            for g, o in zip(groups, out, strict=True):
                o[i].copy_(data[off : off + g.shape[1]])
                off += g.shape[1]
        return out

    # -- ops in order ----------------------------------------------------------------------
    def apply(self, ops: list[Store | Move | Drop]) -> None:
        """Run the scheduler's tier ops in list order (consecutive stores are batched)."""
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
                self._sync_host()
                self._write(op.kind, op.dst, [h[op.src] for h in self.host[op.kind]])
            elif isinstance(op, Drop):
                self._writes.append(self._pool.submit(self.fs.rm_file, self._path(op.kind, op.loc)))
            i += 1

    def _sync_host(self) -> None:
        """Host pools are read on the CPU next: the device-to-host copies must have landed."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).synchronize()

    def _store(self, kind: int, tier: int, ops: list[Store]) -> None:
        ops = sorted(ops, key=lambda o: o.loc)
        idx = torch.tensor([o.gpu for o in ops], dtype=torch.int64, device=self.device)
        gathered = [g.index_select(0, idx) for g in self.gpu[kind]]  # contiguous, in location order
        if tier == HOST:
            for h, src in zip(self.host[kind], gathered, strict=True):
                for pos, loc, n in _runs([o.loc for o in ops]):
                    h[loc : loc + n].copy_(src[pos : pos + n], non_blocking=True)
            self.bytes_stored[HOST] += len(ops) * self.unit_bytes[kind]
        else:
            cpu = [t.cpu() for t in gathered]
            for i, o in enumerate(ops):
                self._write(kind, o.loc, [t[i] for t in cpu])

    # -- promotions ------------------------------------------------------------------------
    def start(self, transfers: list[Transfer]) -> None:
        """Begin promotions (after `apply` of the same step: the side stream waits for it)."""
        import time

        for tr in transfers:
            nbytes = sum(self.unit_bytes[ld.kind] for ld in tr.loads)
            disk = [ld for ld in tr.loads if ld.tier == DISK]
            host = [ld for ld in tr.loads if ld.tier == HOST]
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
            event = self._load_host(host)
            future = self._pool.submit(self._load_disk, disk) if disk else None
            self._pending.append(_Pending(tr, event, future, nbytes, time.perf_counter()))
            self.bytes_loaded[HOST] += sum(self.unit_bytes[ld.kind] for ld in host)
            self.bytes_loaded[DISK] += sum(self.unit_bytes[ld.kind] for ld in disk)

    def _scatter(self, kind: int, gpu_ids: list[int], staged: list[torch.Tensor]) -> None:
        idx = torch.tensor(gpu_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        for g, s in zip(self.gpu[kind], staged, strict=True):
            g.index_copy_(0, idx, s.to(self.device, non_blocking=True))

    def _load_host(self, loads: list[Load]):
        """Host -> GPU for one transfer: contiguous host runs into a staging buffer, one scatter per
        tensor group. Returns the event marking its end (None on a CPU: done already)."""
        if not loads:
            return None
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else _nullctx()
        with ctx:
            for kind in (BLOCK, STATE):
                ls = sorted((ld for ld in loads if ld.kind == kind), key=lambda ld: ld.loc)
                if not ls:
                    continue
                staged = []
                for h in self.host[kind]:
                    buf = torch.empty((len(ls), h.shape[1]), dtype=torch.uint8, device=self.device)
                    for pos, loc, n in _runs([ld.loc for ld in ls]):
                        buf[pos : pos + n].copy_(h[loc : loc + n], non_blocking=True)
                    staged.append(buf)
                self._scatter(kind, [ld.gpu for ld in ls], staged)
            if self.stream is None:
                return None
            ev = torch.cuda.Event()
            ev.record(self.stream)
            return ev

    def _load_disk(self, loads: list[Load]):
        """On the worker thread: read the files, then the same scatter on the side stream."""
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else _nullctx()
        with ctx:
            for kind in (BLOCK, STATE):
                ls = [ld for ld in loads if ld.kind == kind]
                if ls:
                    self._scatter(kind, [ld.gpu for ld in ls], self._read(kind, [ld.loc for ld in ls]))
            if self.stream is None:
                return None
            ev = torch.cuda.Event()
            ev.record(self.stream)
            return ev

    def poll(self, wait: bool = False) -> list[int]:
        """Ids of the promotions whose data is on the GPU now (`wait`: block for at least one)."""
        while self._writes and self._writes[0].done():
            self._writes.pop(0).result()  # a failed disk write raises here, in the engine thread
        done, left = [], []
        for i, p in enumerate(self._pending):
            if wait and not done and i == 0:
                if p.future is not None:
                    p.future.result()
                if p.event is not None:
                    p.event.synchronize()
            if self._finished(p):
                done.append(p.transfer.id)
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

    def flush(self) -> None:
        """Wait for the queued disk writes and deletes."""
        while self._writes:
            self._writes.pop(0).result()

    def close(self) -> None:
        """Finish queued disk work, then remove a temporary disk folder."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._tmp is not None:
            self._tmp.cleanup()


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
