"""Slot bookkeeping for the recurrent (KDA) state: live slots and checkpoint slots.

One slot holds, for every KDA layer, the fp32 recurrent state and the short-conv window of one
sequence (tensors in the model's `HybridCacheTensors`; here only ints). A running request owns
one *live* slot. A *checkpoint* is a slot holding a snapshot of some live state taken when the
sequence stood exactly at a block boundary; it is keyed by the chained hash of the last full
block before that boundary, so it identifies the token prefix it summarises.

Invariants (checked by `check_invariants`):
- every slot is exactly one of: free, live (owned by one request), checkpoint;
- a checkpoint is evictable (in one of the two LRUs) iff it is ready and not pinned;
- a pinned checkpoint is never evicted (it is the source of a copy in the step being run).

Eviction is LRU in two levels like the block pool: LOW (intermediate snapshots) goes before
HIGH (resume points: the end of a prompt, the end of a generation).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

LOW, HIGH = 0, 1


@dataclass(slots=True)
class Checkpoint:
    key: int
    slot: int
    num_tokens: int  # the state summarises exactly this many leading tokens
    priority: int
    ready: bool = False  # becomes True after the step that writes it has run
    pins: int = 0
    ident: object = None  # the exact prefix identity (a BlockKey), compared on a hit


class StatePool:
    """Live and checkpoint slots over one pool of `num_slots` state slots."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError("num_slots must be positive")
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._live: dict[int, str] = {}  # slot -> request id
        self._ckpt: dict[int, Checkpoint] = {}  # key -> checkpoint
        self._ckpt_by_slot: dict[int, int] = {}  # slot -> key
        self._lru: tuple[OrderedDict[int, None], OrderedDict[int, None]] = (OrderedDict(), OrderedDict())
        self.num_evictions = 0
        self.on_evict: Callable[[Checkpoint], None] | None = None  # a checkpoint was dropped

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Slots obtainable now: free plus evictable checkpoints."""
        return len(self._free) + len(self._lru[LOW]) + len(self._lru[HIGH])

    @property
    def num_live(self) -> int:
        return len(self._live)

    @property
    def num_checkpoints(self) -> int:
        return len(self._ckpt)

    def usage(self) -> float:
        return (self.num_slots - len(self._free)) / self.num_slots

    def live_owner(self, slot: int) -> str | None:
        return self._live.get(slot)

    def get_checkpoint(self, key: int) -> Checkpoint | None:
        """A ready checkpoint under `key`, refreshed in its LRU; None if absent or unwritten."""
        ck = self._ckpt.get(key)
        if ck is None or not ck.ready:
            return None
        lru = self._lru[ck.priority]
        if ck.key in lru:
            lru.move_to_end(ck.key)
        return ck

    def has_checkpoint(self, key: int) -> bool:
        return key in self._ckpt

    # -- slots -----------------------------------------------------------------------------
    def _take_slot(self) -> int | None:
        if self._free:
            return self._free.pop()
        for lru in self._lru:
            if lru:
                key, _ = lru.popitem(last=False)
                ck = self._ckpt.pop(key)
                del self._ckpt_by_slot[ck.slot]
                self.num_evictions += 1
                if self.on_evict is not None:
                    self.on_evict(ck)
                return ck.slot
        return None

    def allocate_live(self, request_id: str) -> int | None:
        slot = self._take_slot()
        if slot is not None:
            self._live[slot] = request_id
        return slot

    def free_live(self, slot: int) -> None:
        if slot not in self._live:
            raise ValueError(f"slot {slot} is not live")
        del self._live[slot]
        self._free.append(slot)

    # -- checkpoints -----------------------------------------------------------------------
    def reserve_checkpoint(
        self, key: int, num_tokens: int, priority: int, ident: object = None
    ) -> Checkpoint | None:
        """A new, not yet written checkpoint slot for `key` (pinned until `commit`); None if
        the key exists already or no slot can be had."""
        if key in self._ckpt:
            return None
        slot = self._take_slot()
        if slot is None:
            return None
        ck = Checkpoint(key=key, slot=slot, num_tokens=num_tokens, priority=priority, pins=1, ident=ident)
        self._ckpt[key] = ck
        self._ckpt_by_slot[slot] = key
        return ck

    def commit(self, key: int) -> None:
        """The snapshot into `key`'s slot has been written: it is usable from now on."""
        ck = self._ckpt[key]
        ck.ready = True
        self.unpin(key)

    def pin(self, key: int) -> None:
        ck = self._ckpt[key]
        ck.pins += 1
        self._lru[ck.priority].pop(key, None)

    def unpin(self, key: int) -> None:
        ck = self._ckpt.get(key)
        if ck is None:
            return
        ck.pins -= 1
        if ck.pins < 0:
            raise ValueError(f"checkpoint {key} unpinned more often than pinned")
        if ck.pins == 0 and ck.ready:
            self._lru[ck.priority][key] = None

    def set_priority(self, key: int, priority: int) -> None:
        """Re-rank a checkpoint (an interval snapshot that is also a resume point becomes HIGH)."""
        ck = self._ckpt.get(key)
        if ck is None or ck.priority == priority:
            return
        in_lru = key in self._lru[ck.priority]
        self._lru[ck.priority].pop(key, None)
        ck.priority = priority
        if in_lru:
            self._lru[priority][key] = None

    def drop_checkpoint(self, key: int) -> bool:
        """Forget an unpinned checkpoint (its KV prefix is gone); True if one was dropped."""
        ck = self._ckpt.get(key)
        if ck is None or ck.pins:
            return False
        self._lru[ck.priority].pop(key, None)
        del self._ckpt[key]
        del self._ckpt_by_slot[ck.slot]
        self._free.append(ck.slot)
        if self.on_evict is not None:
            self.on_evict(ck)
        return True

    def evictable(self) -> list[Checkpoint]:
        """Unpinned ready checkpoints in eviction order (LOW first, least recently used first)."""
        return [self._ckpt[k] for lru in self._lru for k in lru]

    def reset_cache(self) -> None:
        for key in [k for k, ck in self._ckpt.items() if not ck.pins]:
            self.drop_checkpoint(key)

    def check_invariants(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("slot freed twice")
        live = set(self._live)
        ck_slots = set(self._ckpt_by_slot)
        if free & live or free & ck_slots or live & ck_slots:
            raise AssertionError("a slot has two roles")
        if len(free) + len(live) + len(ck_slots) != self.num_slots:
            raise AssertionError("a slot is lost")
        for key, ck in self._ckpt.items():
            in_lru = key in self._lru[ck.priority]
            if in_lru != (ck.ready and ck.pins == 0):
                raise AssertionError(f"checkpoint {key} LRU membership is wrong")
            if key in self._lru[1 - ck.priority]:
                raise AssertionError(f"checkpoint {key} is in the wrong LRU")
