"""`benchmarks.long_context`'s `promotion` section: a conversation's KV promoted from the pinned host
tier into the GPU pool (straight copies and through staging + scatter) against one pinned host-to-
device copy of the same bytes."""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from benchmarks.engine_setup import free, sync
from inference.cache.tiers import BLOCK, HOST, Load, Store, TierCapacity, Transfer
from inference.engine.tier_store import TierStore
from inference.model.cache_tensors import HybridCacheSpec, HybridCacheTensors


def pinned_h2d(device, nbytes: int) -> float:
    """Best-of-5 GB/s of one pinned host -> device copy of `nbytes`."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def promotion(spec, dtype, device, context: int) -> dict[str, Any]:
    """The tier store promoting a whole `context`-token conversation (its KV blocks) from the host
    tier into the benchmark config's cache tensors, timed from `start` to its event (the loads
    are built before: the scheduler builds them), vs one pinned copy of the same bytes (no model
    needed: the copies are the same). Two layouts of the GPU targets: `consecutive` (a free run
    of the pool: straight copies into it) and `scattered` (a shuffled order: the staging buffer
    and one scatter per tensor group)."""
    n = context // 64
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, dtype), n + 1, 64, 2, device, dtype
    )
    store = TierStore(cache, TierCapacity(host_blocks=n, host_states=0, disk_bytes=0))
    store.apply([Store(BLOCK, b, HOST, b) for b in range(n)])
    sync(device)
    nbytes = n * store.unit_bytes[BLOCK]
    res: dict[str, Any] = {"context": context, "blocks": n, "bytes": nbytes}
    shuffled = list(range(n))
    random.Random(0).shuffle(shuffled)
    for name, targets in (("consecutive", list(range(n))), ("scattered", shuffled)):
        loads = tuple(Load(BLOCK, HOST, b, g) for b, g in enumerate(targets))
        best = float("inf")
        for i in range(4):  # the first one warms the allocator up
            sync(device)
            t0 = time.perf_counter()
            store.start([Transfer(i, loads)])
            while not store.poll(wait=True):
                pass
            sync(device)
            if i:
                best = min(best, time.perf_counter() - t0)
        res[f"promotion_gb_per_s_{name}"] = round(nbytes / best / 1e9, 2)
    res["promotion_gb_per_s"] = res["promotion_gb_per_s_consecutive"]
    if device.type == "cuda":
        res["pinned_h2d_gb_per_s"] = round(pinned_h2d(device, nbytes), 2)
        for name in ("consecutive", "scattered"):
            res[f"fraction_of_h2d_{name}"] = round(
                res[f"promotion_gb_per_s_{name}"] / res["pinned_h2d_gb_per_s"], 3
            )
        res["fraction_of_h2d"] = res["fraction_of_h2d_consecutive"]
    store.close()
    del cache, store
    free(device)
    return res
