"""Bookkeeping of the offload tiers below the GPU pools: pinned host memory, then disk (any
fsspec URL). Pure ints and lists; the tensor side (`inference/engine/tier_store.py`) performs the
copies this module orders, in order.

What lives here: *entries* keyed like the GPU cache — a full KV block by its chained hash (its
`BlockKey` compared exactly on a hit), a state checkpoint by its checkpoint key (its identity
compared exactly). An entry is made of *units*: a block entry is one BLOCK unit; a checkpoint
entry is one STATE unit plus, for a checkpoint inside a block, the BLOCK unit of its private
partial block. An entry is in exactly one tier (HOST or DISK) and its units move together.

Hybrid rule: a prefix hit from the tiers is usable only where the full KV chain *and* a matching
checkpoint exist (GPU or tier, any mix), so a restore brings back KV and recurrent state together
or not at all. An entry is dropped from the last tier when space runs out; a checkpoint whose
blocks are gone is simply never matched (and is dropped with them).

Eviction inside the tiers is LRU in two levels like the GPU pools (LOW before HIGH, where HIGH
are the blocks of finished prompts and the resume-point checkpoints, LOW the interval snapshots
and the blocks of aborted requests); an entry leaving the host
tier is moved to disk if the disk tier is configured and has room, else dropped. Entries being
read by an in-flight promotion are pinned and never evicted.

Invariants (checked by `check_invariants`): every entry's units hold distinct locations of its
tier; free host locations are disjoint from used ones; used bytes never exceed capacity; an
entry is in its tier's LRU iff it is unpinned.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

HOST, DISK = 1, 2
BLOCK, STATE = 0, 1  # unit kinds
LOW, HIGH = 0, 1
TIER_NAMES = {HOST: "host", DISK: "disk"}


@dataclass(frozen=True, slots=True)
class TierConfig:
    """Capacity of each tier below the GPU (0 = off) and which sequences are worth offloading."""

    host_bytes: int = 0
    disk_bytes: int = 0
    disk_url: str = ""  # fsspec URL or local folder; "" with disk_bytes > 0: a fresh temporary folder
    offload_min_tokens: int = 0  # only prefixes of sequences at least this long leave the GPU

    def __post_init__(self) -> None:
        if self.host_bytes < 0 or self.disk_bytes < 0 or self.offload_min_tokens < 0:
            raise ValueError("tier capacities and offload_min_tokens must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.host_bytes > 0 or self.disk_bytes > 0


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """Host locations per unit kind (fixed pinned pools) and disk bytes."""

    host_blocks: int
    host_states: int
    disk_bytes: int


def tier_capacity(cfg: TierConfig, block_bytes: int, state_bytes: int) -> TierCapacity:
    """Split the host bytes: state snapshots take at most a quarter (at least one when both fit),
    KV blocks the rest (a long conversation is mostly KV; its resume points and interval
    snapshots, one per `checkpoint_interval` tokens, are few states)."""
    states = 0
    if state_bytes and cfg.host_bytes >= state_bytes + block_bytes:
        states = max(1, cfg.host_bytes // 4 // state_bytes)
    blocks = (cfg.host_bytes - states * state_bytes) // max(block_bytes, 1)
    return TierCapacity(int(blocks), int(states), cfg.disk_bytes)


@dataclass(frozen=True, slots=True)
class Store:
    """Copy GPU block/slot `gpu` into unit location `loc` of `tier`."""

    kind: int
    gpu: int
    tier: int
    loc: int


@dataclass(frozen=True, slots=True)
class Move:
    """Copy host location `src` to disk location `dst` (the host location is then reusable)."""

    kind: int
    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class Drop:
    """Delete disk location `loc` (host locations need no op: they are just reused)."""

    kind: int
    loc: int


@dataclass(frozen=True, slots=True)
class Load:
    """Copy unit location `loc` of `tier` into GPU block/slot `gpu`."""

    kind: int
    tier: int
    loc: int
    gpu: int


@dataclass(frozen=True, slots=True)
class Transfer:
    """One promotion: loads that run asynchronously; its request waits until it is reported done."""

    id: int
    loads: tuple[Load, ...]


@dataclass(slots=True)
class TierOps:
    """What the runner does at the start of a step: `ops` in list order before any cache write of
    the step; `transfers` start after the step's block and state copies (a deferred snapshot may
    read a slot or block a promotion now targets) and must not overtake either."""

    ops: list[Store | Move | Drop] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.ops or self.transfers)


@dataclass(slots=True)
class TierEntry:
    key: int
    ident: object  # BlockKey (block, or checkpoint at a block boundary) or TailKey
    is_ckpt: bool
    tier: int
    units: list[tuple[int, int]]  # (kind, loc)
    priority: int
    num_tokens: int = 0  # checkpoints: the state summarises this many leading tokens
    pins: int = 0


class TierIndex:
    """Which entry is in which tier, where, and what the runner must copy to keep it so."""

    def __init__(self, capacity: TierCapacity, block_bytes: int, state_bytes: int) -> None:
        self.capacity = capacity
        self.unit_bytes = {BLOCK: block_bytes, STATE: state_bytes}
        self.blocks: dict[int, TierEntry] = {}
        self.ckpts: dict[int, TierEntry] = {}
        self.tails: dict[int | None, dict[int, object]] = {}  # parent hash -> {ckpt key: TailKey}
        self._host_free = {
            BLOCK: list(range(capacity.host_blocks - 1, -1, -1)),
            STATE: list(range(capacity.host_states - 1, -1, -1)),
        }
        self._disk_next = 0
        self.disk_used = 0
        self._lru = {t: (OrderedDict(), OrderedDict()) for t in (HOST, DISK)}  # (is_ckpt, key)
        self.ops: list[Store | Move | Drop] = []
        self.num_stored = {HOST: 0, DISK: 0}
        self.num_dropped = 0

    # -- queries ---------------------------------------------------------------------------
    def block(self, key) -> TierEntry | None:
        """The block entry holding exactly `key` (a BlockKey), or None."""
        e = self.blocks.get(key.hash)
        return e if e is not None and e.ident == key else None

    def ckpt(self, key: int, ident: object) -> TierEntry | None:
        e = self.ckpts.get(key)
        return e if e is not None and e.ident == ident else None

    def _bytes(self, units: list[tuple[int, int]] | list[int]) -> int:
        return sum(self.unit_bytes[u[0] if isinstance(u, tuple) else u] for u in units)

    # -- placing entries -------------------------------------------------------------------
    def _lru_of(self, e: TierEntry) -> OrderedDict:
        return self._lru[e.tier][e.priority]

    def _host_room(self, kinds: list[int]) -> bool:
        """Free host locations for `kinds`, evicting unpinned host entries (LRU) as needed."""
        while any(kinds.count(k) > len(self._host_free[k]) for k in (BLOCK, STATE)):
            short = {k for k in (BLOCK, STATE) if kinds.count(k) > len(self._host_free[k])}
            victim = self._victim(HOST, short)
            if victim is None:
                return False
            self._demote(victim)
        return True

    def _victim(self, tier: int, kinds: set[int] | None = None) -> TierEntry | None:
        for lru in self._lru[tier]:
            for is_ckpt, key in lru:
                e = (self.ckpts if is_ckpt else self.blocks)[key]
                if kinds is None or any(k in kinds for k, _ in e.units):
                    return e
        return None

    def _disk_room(self, nbytes: int) -> bool:
        if nbytes > self.capacity.disk_bytes:
            return False
        while self.disk_used + nbytes > self.capacity.disk_bytes:
            victim = self._victim(DISK)
            if victim is None:
                return False
            self._remove(victim)
        return True

    def _demote(self, e: TierEntry) -> None:
        """Host -> disk (or out, if the disk tier cannot take it)."""
        nbytes = self._bytes(e.units)
        self._lru_of(e).pop((e.is_ckpt, e.key))
        if self.capacity.disk_bytes and self._disk_room(nbytes):
            units = []
            for kind, loc in e.units:
                dst = self._new_disk_loc()
                self.ops.append(Move(kind, loc, dst))
                self._host_free[kind].append(loc)
                units.append((kind, dst))
            self.disk_used += nbytes
            e.tier, e.units = DISK, units
            self._lru_of(e)[(e.is_ckpt, e.key)] = None
            self.num_stored[DISK] += 1
        else:
            self._lru_of(e)[(e.is_ckpt, e.key)] = None  # _remove pops it again
            self._remove(e)

    def _new_disk_loc(self) -> int:
        self._disk_next += 1  # never reused: a deleted file and a new one cannot be confused
        return self._disk_next

    def _remove(self, e: TierEntry) -> None:
        """Forget an entry (its host locations are reused, its disk files deleted)."""
        self._lru_of(e).pop((e.is_ckpt, e.key), None)
        for kind, loc in e.units:
            if e.tier == HOST:
                self._host_free[kind].append(loc)
            else:
                self.ops.append(Drop(kind, loc))
        if e.tier == DISK:
            self.disk_used -= self._bytes(e.units)
        if e.is_ckpt:
            del self.ckpts[e.key]
            parent = getattr(e.ident, "parent", None)
            tails = self.tails.get(parent)
            if tails is not None and e.key in tails:
                del tails[e.key]
                if not tails:
                    del self.tails[parent]
        else:
            del self.blocks[e.key]
            # checkpoints at or inside this block's end can never be matched again
            for ck in [c for c in (self.ckpts.get(e.key),) if c is not None and not c.pins]:
                self._remove(ck)
            for key in list(self.tails.get(e.key, {})):
                ck = self.ckpts.get(key)
                if ck is not None and not ck.pins:
                    self._remove(ck)
        self.num_dropped += 1

    def _place(self, gpu_units: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]] | None:
        """Locations for units leaving the GPU ((kind, gpu index) each): host if it has (or can
        make) room, else disk; emits the stores. None if no tier can take them."""
        kinds = [k for k, _ in gpu_units]
        if self._host_capable(kinds) and self._host_room(kinds):
            units = [(k, self._host_free[k].pop()) for k in kinds]
            tier = HOST
        elif self.capacity.disk_bytes and self._disk_room(self._bytes(kinds)):
            units = [(k, self._new_disk_loc()) for k in kinds]
            self.disk_used += self._bytes(kinds)
            tier = DISK
        else:
            return None
        for (kind, gpu), (_, loc) in zip(gpu_units, units, strict=True):
            self.ops.append(Store(kind, gpu, tier, loc))
        self.num_stored[tier] += 1
        return tier, units

    def _host_capable(self, kinds: list[int]) -> bool:
        cap = {BLOCK: self.capacity.host_blocks, STATE: self.capacity.host_states}
        return all(kinds.count(k) <= cap[k] for k in (BLOCK, STATE))

    def store_block(self, gpu_block: int, key, priority: int) -> bool:
        """A cached GPU block is being evicted: keep its contents below. True if they are kept
        (already there: refreshed, no copy)."""
        e = self.block(key)
        if e is not None:
            self._touch(e, priority)
            return True
        old = self.blocks.get(key.hash)
        if old is not None:  # a hash collision: the newer contents win, unless the old is being read
            if old.pins:
                return False
            self._remove(old)
        placed = self._place([(BLOCK, gpu_block)])
        if placed is None:
            return False
        tier, units = placed
        e = TierEntry(key.hash, key, False, tier, units, priority)
        self.blocks[key.hash] = e
        self._lru_of(e)[(False, e.key)] = None
        return True

    def store_ckpt(
        self, key: int, ident: object, slot: int, block: int | None, num_tokens: int, priority: int
    ) -> bool:
        """A GPU checkpoint (its state slot, and private block if inside a block) leaves the GPU."""
        e = self.ckpt(key, ident)
        if e is not None:
            self._touch(e, priority)
            return True
        if key in self.ckpts:
            old = self.ckpts[key]
            if old.pins:
                return False
            self._remove(old)
        units = [(STATE, slot)] + ([(BLOCK, block)] if block is not None else [])
        placed = self._place(units)
        if placed is None:
            return False
        tier, locs = placed
        e = TierEntry(key, ident, True, tier, locs, priority, num_tokens)
        self.ckpts[key] = e
        self._lru_of(e)[(True, key)] = None
        if block is not None:
            self.tails.setdefault(ident.parent, {})[key] = ident
        return True

    def _touch(self, e: TierEntry, priority: int) -> None:
        lru = self._lru_of(e)
        if (e.is_ckpt, e.key) in lru:
            del lru[(e.is_ckpt, e.key)]
            e.priority = max(e.priority, priority)
            self._lru_of(e)[(e.is_ckpt, e.key)] = None

    # -- promotion -------------------------------------------------------------------------
    def pin(self, e: TierEntry) -> None:
        """Being read by a promotion: not evicted until `unpin`."""
        e.pins += 1
        self._lru_of(e).pop((e.is_ckpt, e.key), None)

    def unpin(self, e: TierEntry) -> None:
        e.pins -= 1
        if e.pins < 0:
            raise ValueError(f"tier entry {e.key} unpinned more often than pinned")
        if e.pins == 0:
            self._lru_of(e)[(e.is_ckpt, e.key)] = None  # stays below: the tiers are inclusive

    def loads(self, e: TierEntry, gpu: list[int]) -> list[Load]:
        """Loads bringing entry `e`'s units into GPU blocks/slots `gpu` (same order as units)."""
        return [Load(kind, e.tier, loc, g) for (kind, loc), g in zip(e.units, gpu, strict=True)]

    def take_ops(self) -> list[Store | Move | Drop]:
        ops, self.ops = self.ops, []
        return ops

    def clear(self) -> None:
        """Forget every unpinned entry (a cold cache)."""
        for e in [*self.ckpts.values(), *self.blocks.values()]:
            if not e.pins and (self.ckpts if e.is_ckpt else self.blocks).get(e.key) is e:
                self._remove(e)  # (removing a block may have removed its checkpoints already)

    def stats(self) -> dict[str, int]:
        host = sum(1 for e in [*self.blocks.values(), *self.ckpts.values()] if e.tier == HOST)
        return {
            "tier_host_entries": host,
            "tier_disk_entries": len(self.blocks) + len(self.ckpts) - host,
            "tier_disk_bytes": self.disk_used,
            "tier_stored_host": self.num_stored[HOST],
            "tier_stored_disk": self.num_stored[DISK],
            "tier_dropped": self.num_dropped,
        }

    def check_invariants(self) -> None:
        used = {HOST: {BLOCK: set(), STATE: set()}, DISK: {BLOCK: set(), STATE: set()}}
        disk_bytes = 0
        for e in [*self.blocks.values(), *self.ckpts.values()]:
            for kind, loc in e.units:
                if loc in used[e.tier][kind]:
                    raise AssertionError(f"tier location {loc} used twice")
                used[e.tier][kind].add(loc)
            if e.tier == DISK:
                disk_bytes += self._bytes(e.units)
            if ((e.is_ckpt, e.key) in self._lru_of(e)) != (e.pins == 0):
                raise AssertionError(f"tier entry {e.key} LRU membership is wrong")
        for kind in (BLOCK, STATE):
            if used[HOST][kind] & set(self._host_free[kind]):
                raise AssertionError("a host location is both free and used")
        if disk_bytes != self.disk_used or disk_bytes > self.capacity.disk_bytes:
            raise AssertionError(f"disk bytes {disk_bytes} vs recorded {self.disk_used}")
