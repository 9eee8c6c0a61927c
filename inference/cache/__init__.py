"""KV block pool, recurrent-state slot pool and the exact hybrid prefix cache (no torch here)."""

from inference.cache.block_pool import BlockKey, BlockPool
from inference.cache.coordinator import Allocation, CacheConfig, HybridCacheCoordinator, MMSpan, PrefixHit
from inference.cache.state_pool import Checkpoint, StatePool

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
]
