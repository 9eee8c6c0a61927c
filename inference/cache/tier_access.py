"""The coordinator's methods that face the tiers below the GPU: admission waits for promotions, the
runner's transfers and the copies it must make (see tiers.py and promotion.py). A base class of
`HybridCacheCoordinator`, apart only to keep each file short."""

from __future__ import annotations

from collections.abc import Sequence

from inference.cache.promotion import Promoter
from inference.cache.records import CacheConfig, MMSpan, ReqCache
from inference.cache.tiers import TierIndex, TierOps


class TierAccess:
    config: CacheConfig
    B: int
    tiers: TierIndex | None
    promoter: Promoter | None
    _worth_blocks: set[int]
    _worth_ckpts: set[int]

    def _flag_worth(self, rc: ReqCache, key: int, p: int) -> None:
        """A checkpoint at p >= offload_min_tokens makes it and the blocks before it worth
        offloading (a short prefix is cheaper to recompute than to keep below the GPU)."""
        if self.tiers is None or not self.config.tiers.offload_min_tokens:
            return
        if p >= self.config.tiers.offload_min_tokens:
            self._worth_ckpts.add(key)
            n = p // self.B
            self._worth_blocks.update(k.hash for k in rc.keys[rc.num_flagged : n])
            rc.num_flagged = max(rc.num_flagged, n)

    def _is_worth(self, key: int, worth: set[int]) -> bool:
        return not self.config.tiers.offload_min_tokens or key in worth

    def prepare(self, req_id: str, token_ids: Sequence[int], mm: Sequence[MMSpan] = ()) -> bool:
        """Before admitting a waiting request: False while part of its prefix is on its way back
        from a tier (a promotion is started here when the tiers hold a deeper hit than the GPU)."""
        if self.promoter is None:
            return True
        return self.promoter.prepare(req_id, token_ids, mm)

    def abandon_transfers(self, transfer_ids: Sequence[int]) -> None:
        """Promotions whose step failed before the runner started them: undo them."""
        for t in transfer_ids:
            self.promoter.abandon(t)

    def release_other_promotions(self, keep: str) -> bool:
        """Give back the promotion holds of waiting requests other than `keep` (see promotion.py)."""
        return self.promoter is not None and self.promoter.release_others(keep)

    def transfers_done(self, transfer_ids: Sequence[int]) -> None:
        """The runner finished these promotions: their blocks and checkpoints are usable now."""
        for t in transfer_ids:
            self.promoter.complete(t)

    def take_tier_ops(self) -> TierOps | None:
        """The copies the runner must make at the start of the next step (None: nothing)."""
        if self.tiers is None:
            return None
        ops = TierOps(self.tiers.take_ops(), self.promoter.take_transfers())
        return ops if ops else None

    @property
    def num_transfers_in_flight(self) -> int:
        return 0 if self.promoter is None else self.promoter.num_in_flight

    def tier_stats(self) -> dict[str, int]:
        if self.tiers is None:
            return {}
        return {**self.tiers.stats(), **self.promoter.stats()}
