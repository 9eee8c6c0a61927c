"""Start-up memory planning: what the weights and a profiled peak forward leave, less a headroom,
sizes the KV block pool and the state pool; a configuration that cannot work fails here, at start.

Pure arithmetic on byte counts (no torch): the factory measures the device, this module decides.
Headroom defaults to 20% of the device (the usual advice for million-token contexts: CUDA graphs,
allocator fragmentation and other processes live there). A request longer than `max_model_len` is
refused by the scheduler with a 400; this plan guarantees that one of `max_model_len` always fits.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


class MemoryPlanError(ValueError):
    """The engine configuration cannot fit; the message names the numbers and what to change."""


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    block_size: int
    num_blocks: int
    num_state_slots: int
    kv_bytes_per_block: int
    state_bytes_per_slot: int
    device_total: int = 0  # 0: not measured (CPU: the configured pools are the plan)
    in_use: int = 0  # by weights and everything else on the device after loading
    activations: int = 0  # peak growth of a profiled forward of the largest step
    headroom: int = 0

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.kv_bytes_per_block

    @property
    def state_bytes(self) -> int:
        return self.num_state_slots * self.state_bytes_per_slot

    @property
    def max_cached_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self) -> str:
        head = (
            f"device {_gib(self.device_total)}: in use {_gib(self.in_use)}, activations "
            f"{_gib(self.activations)}, headroom {_gib(self.headroom)}; "
            if self.device_total
            else ""
        )
        return (
            f"{head}KV pool {self.num_blocks} blocks x {self.block_size} tokens = "
            f"{self.max_cached_tokens} tokens ({_gib(self.kv_bytes)}), state pool "
            f"{self.num_state_slots} slots ({_gib(self.state_bytes)})"
        )


def check_pools(plan: MemoryPlan, max_model_len: int) -> MemoryPlan:
    """A sequence of `max_model_len` tokens must fit the KV pool, with a live state slot."""
    need = -(-max_model_len // plan.block_size)
    if plan.num_blocks < need:
        raise MemoryPlanError(
            f"max_model_len {max_model_len} needs {need} KV blocks of {plan.block_size} tokens "
            f"({_gib(need * plan.kv_bytes_per_block)}), but the pool has {plan.num_blocks} "
            f"({plan.describe()}); lower --max-model-len or give the pool more memory"
        )
    if plan.num_state_slots < 1:
        raise MemoryPlanError("the state pool needs at least one slot")
    return plan


def plan_memory(
    *,
    device_total: int,
    in_use: int,
    activations: int,
    block_size: int,
    kv_bytes_per_block: int,
    state_bytes_per_slot: int,
    num_state_slots: int,
    max_model_len: int,
    headroom_fraction: float = 0.2,
    num_blocks: int | None = None,
) -> MemoryPlan:
    """Size the pools from measured device memory. `num_blocks` given: check that it fits instead."""
    if not 0.0 <= headroom_fraction < 1.0:
        raise MemoryPlanError(f"headroom must be in [0, 1), got {headroom_fraction}")
    headroom = int(device_total * headroom_fraction)
    budget = device_total - headroom - in_use - activations
    state = num_state_slots * state_bytes_per_slot
    fit = max((budget - state) // max(kv_bytes_per_block, 1), 0)
    plan = MemoryPlan(
        block_size,
        fit if num_blocks is None else num_blocks,
        num_state_slots,
        kv_bytes_per_block,
        state_bytes_per_slot,
        device_total,
        in_use,
        activations,
        headroom,
    )
    if state > budget:
        raise MemoryPlanError(
            f"{num_state_slots} state slots need {_gib(state)}, but only {_gib(max(budget, 0))} are left "
            f"({plan.describe()}); lower --num-state-slots or the headroom"
        )
    if num_blocks is not None and num_blocks > fit:
        raise MemoryPlanError(
            f"--num-blocks {num_blocks} needs {_gib(num_blocks * kv_bytes_per_block)}, but only "
            f"{_gib(fit * kv_bytes_per_block)} are left for the KV pool ({plan.describe()})"
        )
    return check_pools(plan, max_model_len)
