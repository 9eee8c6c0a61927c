"""KV block pool, recurrent-state slot pool, the exact hybrid prefix cache and the offload tiers bookkeeping
(no torch here)."""

from inference.cache.block_pool import BlockKey, BlockPool
from inference.cache.coordinator import Allocation, CacheConfig, HybridCacheCoordinator, MMSpan, PrefixHit
from inference.cache.state_pool import Checkpoint, StatePool
from inference.cache.tiers import TierConfig, TierIndex, TierOps

__all__ = [
    "Allocation",
    "BlockKey",
    "BlockPool",
    "CacheConfig",
    "Checkpoint",
    "HybridCacheCoordinator",
    "MMSpan",
    "PrefixHit",
    "StatePool",
    "TierConfig",
    "TierIndex",
    "TierOps",
]
