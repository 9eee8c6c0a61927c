"""The coordinator's vocabulary: its configuration, prefix keys and the records it returns.

Plain frozen records shared by `coordinator.py`, `promotion.py` and the scheduler (no torch, no
behaviour beyond validation and hashing).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from inference.cache.block_pool import BlockKey
from inference.cache.tiers import TierConfig


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int = 1024
    num_state_slots: int = 64
    enable_prefix_caching: bool = True
    checkpoint_interval: int = 1024  # tokens; a multiple of block_size
    tiers: TierConfig = field(
        default_factory=TierConfig
    )  # host and disk tiers below the GPU pools (off by default)
    # block keys of ended requests kept for the requests that extend them (`PrefixLink`): at most
    # this many requests' keys, and this many keys in all (least recently used dropped first;
    # 1 << 19 blocks of 16: the 8M tokens of the server's conversation store)
    kept_key_sets: int = 256
    kept_key_blocks: int = 1 << 19

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_blocks <= 0 or self.num_state_slots <= 0:
            raise ValueError("block_size, num_blocks and num_state_slots must be positive")
        if self.checkpoint_interval <= 0 or self.checkpoint_interval % self.block_size:
            raise ValueError("checkpoint_interval must be a positive multiple of block_size")
        if self.kept_key_sets < 0 or self.kept_key_blocks < 0:
            raise ValueError("kept_key_sets and kept_key_blocks must be >= 0 (0: keep none)")


@dataclass(frozen=True, slots=True)
class MMSpan:
    """Positions [offset, offset+length) hold placeholders of an item whose content hash is `key`."""

    offset: int
    length: int
    key: Hashable


@dataclass(frozen=True, slots=True)
class PrefixLink:
    """A request's place in a conversation, stated by the layer that built its prompt (the
    server's incremental chat path, which appends a turn's new ids to the ids it kept).

    `name`: unique per request prompt; the request's block keys are kept under it when it ends.
    `extends` / `num_shared`: the first `num_shared` tokens of this prompt are exactly the first
    `num_shared` tokens of the request named `extends`; the keys of those blocks are then copied
    from it, not built and hashed again. Only the layer that knows both prompts came from one list
    may say so: a false claim would serve a wrong prefix from the cache."""

    name: str
    extends: str | None = None
    num_shared: int = 0

    def __post_init__(self) -> None:
        if not self.name or self.num_shared < 0 or (self.extends is None and self.num_shared):
            raise ValueError("a PrefixLink needs a name, and num_shared >= 0 only with `extends`")


@dataclass(frozen=True, slots=True)
class TailKey:
    """Identity of a checkpoint inside a block: the full-block chain before it and the tail tokens."""

    parent: int | None
    tokens: tuple[int, ...]
    extra: tuple[Hashable, ...] = ()

    @property
    def hash(self) -> int:
        return hash(("tail", self.parent, self.tokens, self.extra))


@dataclass(frozen=True, slots=True)
class PrefixHit:
    num_tokens: int = 0
    block_ids: tuple[int, ...] = ()  # shared full blocks
    checkpoint_key: int | None = None
    partial_block: int | None = None  # the checkpoint's private copy of the partial block


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the runner must do before the forward for one request, and its new blocks."""

    new_block_ids: tuple[int, ...]
    slot: int
    copy_from: int | None = None  # checkpoint slot to copy into `slot`
    zero: bool = False  # zero `slot` (a fresh sequence)
    block_copy: tuple[int, int] | None = None  # (checkpoint's partial block, the request's block)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Copy live slot -> checkpoint slot (and, inside a block, the KV block -> the checkpoint's)."""

    src_slot: int
    dst_slot: int
    block_copy: tuple[int, int] | None = None


@dataclass(slots=True)
class ReqCache:
    """One request's cache bookkeeping inside the coordinator."""

    block_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    keys: list[BlockKey] = field(default_factory=list)  # keys of full blocks, computed lazily
    num_cached: int = 0  # leading blocks registered in the pool (by us or shared)
    pending: list[int] = field(default_factory=list)  # checkpoint keys reserved in this step
    num_flagged: int = 0  # leading block keys marked worth offloading (offload_min_tokens)
    num_linked: int = 0  # leading keys copied from the request this one extends (`PrefixLink`)
    linked_from: str | None = None  # that request's name
    # what `allocate` returns for a step its blocks already cover (set with `slot`): built once,
    # not per decode step (it is frozen, so sharing it is safe)
    no_new: Allocation | None = None


def extra_keys(mm: Sequence[MMSpan], lo: int, hi: int) -> tuple[Hashable, ...]:
    """The content keys of the items overlapping positions [lo, hi)."""
    return tuple(s.key for s in mm if s.offset < hi and s.offset + s.length > lo)
