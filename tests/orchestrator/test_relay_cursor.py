"""The relay's cursor: ids skipped over while their transaction runs are published once it commits,
given up once it cannot any more, and the saved mark is where a restarted relay begins."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Connection, delete, func, select, text

from orchestrator.kafka.outbox_cursor import Hole, OutboxCursor
from orchestrator.kafka.relay import Relay, RelayConfig, low_water, unpublished_count
from orchestrator.store import events_t
from tests.orchestrator.conftest import submit
from tests.orchestrator.test_relay import FakeProducer


# -- the bookkeeping alone -------------------------------------------------------------------------
def test_a_skipped_id_is_a_hole_until_it_appears():
    c = OutboxCursor.starting_at(1)
    c.advance([1, 2, 6], [], xmin=100, xmax=103)  # 3-5 are missing while 100-102 may run
    assert (c.frontier, c.holes, c.low_water) == (6, [Hole(3, 5, 103)], 3)
    c.advance([7], [4], xmin=101, xmax=104)  # 4 showed up; 100-102 may still run: 3 and 5 stay
    assert (c.holes, c.low_water) == ([Hole(3, 3, 103), Hole(5, 5, 103)], 3)
    c.advance([], [3], xmin=103, xmax=105)  # everything that could hold 5 has finished
    assert (c.holes, c.low_water) == ([], 8)


def test_with_nothing_running_a_missing_id_is_final():
    c = OutboxCursor.starting_at(10)
    c.advance([10, 13], [], xmin=7, xmax=7)
    assert (c.holes, c.low_water) == ([], 14)


def test_a_gap_of_any_size_is_one_hole():
    c = OutboxCursor.starting_at(1)
    c.advance([1, 10_000_002], [], xmin=5, xmax=9)
    assert c.holes == [Hole(2, 10_000_001, 9)]
    c.advance([], [2, 10_000_001], xmin=6, xmax=9)  # its two ends show up
    assert c.holes == [Hole(3, 10_000_000, 9)]


def test_ids_must_ascend_past_the_frontier():
    c = OutboxCursor.starting_at(5)
    with pytest.raises(ValueError, match="frontier 4"):
        c.advance([4], [], xmin=1, xmax=1)


# -- against the database ----------------------------------------------------------------------
def _seqs(producer: FakeProducer) -> list[tuple[str, int]]:
    return [(k.decode(), json.loads(v)["seq"]) for t, k, v in producer.sent if t == "dayzero.events"]


_ADD_EVENT = text("INSERT INTO events (task_id, seq, type, created_at) VALUES (:t, 3, 'test.e', now())")


@contextmanager
def _event_held_open(db, held_task: str, committed_task: str) -> Iterator[Connection]:
    """An event of `held_task` in a transaction left open (it writes the task row first, as every
    writer does), then one of `committed_task` committed after it: a larger id visible first."""
    held = db.connect()
    try:
        held.execute(text("UPDATE tasks SET updated_at = now() WHERE id = :t"), {"t": held_task})
        held.execute(_ADD_EVENT, {"t": held_task})
        with db.begin() as conn:
            conn.execute(_ADD_EVENT, {"t": committed_task})
        yield held
    finally:
        held.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_event_committed_after_a_later_one_is_still_published(db):
    early, late = submit(db, {"cycles": 1}), submit(db, {"cycles": 1})
    p = FakeProducer()
    relay = Relay(db, p, RelayConfig(batch_size=100))
    relay.run_until_drained()
    with _event_held_open(db, early, late) as held:
        p.sent.clear()
        relay.run_until_drained()
        assert _seqs(p) == [(late, 3)]
        with db.connect() as conn:
            # The mark waits below the held id: the later event, although sent, stays above it.
            assert unpublished_count(conn) == 1
        held.commit()
    p.sent.clear()
    relay.run_until_drained()
    assert _seqs(p) == [(early, 3)]  # published late, not lost
    relay.publish_batch()  # the horizon has passed: the mark moves up to the frontier
    with db.connect() as conn:
        assert unpublished_count(conn) == 0


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_id_whose_transaction_rolled_back_is_given_up(db):
    a, b = submit(db, {"cycles": 1}), submit(db, {"cycles": 1})
    relay = Relay(db, FakeProducer(), RelayConfig(batch_size=100))
    relay.run_until_drained()
    with _event_held_open(db, a, b) as held:
        relay.run_until_drained()
        assert len(relay._cursor.holes) == 1
        held.rollback()
    relay.publish_batch()
    relay.publish_batch()
    assert relay._cursor.holes == []
    with db.connect() as conn:
        assert unpublished_count(conn) == 0
        assert low_water(conn) == conn.execute(select(func.max(events_t.c.id))).scalar_one() + 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_event_ids_are_drawn_in_time_order_across_sessions(db):
    """The hole rule needs it: a per-session sequence cache would hand out ids out of order."""
    with db.connect() as conn:
        cache = conn.execute(
            text(
                "SELECT seqcache FROM pg_sequence WHERE seqrelid = pg_get_serial_sequence('events', 'id')::regclass"
            )
        ).scalar_one()
    assert cache == 1


def test_a_restarted_relay_starts_at_the_saved_mark(db):
    for _ in range(3):
        submit(db, {"cycles": 1})
    first = FakeProducer()
    Relay(db, first, RelayConfig(batch_size=2)).run_until_drained()
    assert len(_seqs(first)) == 6
    again = FakeProducer()
    Relay(db, again, RelayConfig(batch_size=2)).run_until_drained()
    assert again.sent == []  # nothing is sent twice by a relay that stopped cleanly
    new = submit(db, {"cycles": 1})
    Relay(db, again, RelayConfig(batch_size=2)).run_until_drained()
    assert _seqs(again) == [(new, 1), (new, 2)]


def test_an_event_id_is_never_handed_out_twice(db):
    """A deleted newest event must not give its id to the next one (it would sit below the mark)."""
    submit(db, {"cycles": 1})
    relay = Relay(db, FakeProducer(), RelayConfig(batch_size=100))
    relay.run_until_drained()
    with db.begin() as conn:
        top = conn.execute(select(func.max(events_t.c.id))).scalar_one()
        conn.execute(delete(events_t).where(events_t.c.id == top))
    new = submit(db, {"cycles": 1})
    with db.connect() as conn:
        ids = conn.execute(select(events_t.c.id).where(events_t.c.task_id == new)).scalars().all()
    assert min(ids) > top
    p = FakeProducer()
    relay.producer = p
    relay.run_until_drained()
    assert _seqs(p) == [(new, 1), (new, 2)]


def test_rows_without_an_event_are_passed_over(db):
    """History rows that migration 0011 made from old step and message rows (`type` NULL) are not
    sent, count as published, and a batch of nothing else does not end the drain."""
    old = submit(db, {"cycles": 1})
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (task_id, seq, created_at, role, content) VALUES (:t, -1, CURRENT_TIMESTAMP, 'tool', '1')"
            ),
            {"t": old},
        )
        assert unpublished_count(conn) == 2  # the task's two events, not the migrated row
    new = submit(db, {"cycles": 1})
    p = FakeProducer()
    Relay(db, p, RelayConfig(batch_size=1)).run_until_drained()
    assert _seqs(p) == [(old, 1), (old, 2), (new, 1), (new, 2)]
    with db.connect() as conn:
        assert unpublished_count(conn) == 0
