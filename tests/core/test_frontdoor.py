"""The front door's admission rule, driven directly on an event loop (no server)."""

from __future__ import annotations

import asyncio

import pytest

from core.frontdoor import Admission, FrontDoorLimits


def test_slots_then_a_bounded_queue_then_429():
    async def scenario():
        adm = Admission(max_in_flight=2, max_queue=1, max_wait_s=10)
        assert await adm.acquire() is None and await adm.acquire() is None
        waiter = asyncio.ensure_future(adm.acquire())
        await asyncio.sleep(0)
        assert adm.queued == 1
        refusal = await adm.acquire()  # the queue is full
        assert refusal is not None and refusal.status == 429 and refusal.retry_after_s >= 1
        adm.release(0.01)  # the slot passes to the waiter
        assert await waiter is None
        assert (adm.in_flight, adm.queued) == (2, 0)
        adm.release(0.01)
        adm.release(0.01)
        assert adm.in_flight == 0

    asyncio.run(scenario())


def test_a_wait_longer_than_the_bound_is_refused_estimated_or_actual():
    async def scenario():
        adm = Admission(max_in_flight=1, max_queue=10, max_wait_s=0.05)
        assert await adm.acquire() is None
        t0 = asyncio.get_running_loop().time()
        refusal = await adm.acquire()  # nothing known about hold times: it waits, then gives up
        assert refusal is not None and refusal.status == 429
        assert asyncio.get_running_loop().time() - t0 >= 0.05
        assert adm.queued == 0
        adm.release(1.0)  # slots are now known to be held ~1 s: a wait is estimated past the bound
        assert await adm.acquire() is None
        t0 = asyncio.get_running_loop().time()
        refusal = await adm.acquire()
        assert refusal is not None and refusal.retry_after_s == 1
        assert asyncio.get_running_loop().time() - t0 < 0.05  # refused at once, not after waiting

    asyncio.run(scenario())


def test_a_waiter_that_goes_away_leaves_no_slot_behind():
    async def scenario():
        adm = Admission(max_in_flight=1, max_queue=5, max_wait_s=10)
        assert await adm.acquire() is None
        waiter = asyncio.ensure_future(adm.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert adm.queued == 0
        adm.release(0.01)
        assert adm.in_flight == 0

    asyncio.run(scenario())


def test_limits_are_checked():
    with pytest.raises(ValueError):
        FrontDoorLimits(max_in_flight=-1)
    with pytest.raises(ValueError):
        FrontDoorLimits(max_body_bytes=10)
