"""The outage classification and its wait-out loop (`core.outage`), on real database errors."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DataError, OperationalError

from core.backoff import Backoff
from core.outage import OutageOutlasted, Stopped, is_outage, wait_out
from orchestrator.db.engine import make_engine


def test_a_data_error_is_not_an_outage(pg_url):
    # Before: every DBAPIError was an outage, so one record the database refused was retried forever.
    engine = make_engine(pg_url)
    try:
        with pytest.raises(DataError) as data_error, engine.connect() as conn:
            conn.execute(text("SELECT 1 / 0"))
        with pytest.raises(DataError) as jsonb_error, engine.connect() as conn:
            conn.execute(text("SELECT CAST(:v AS jsonb)"), {"v": '{"n": Infinity}'})
    finally:
        engine.dispose()
    assert not is_outage(data_error.value)
    assert not is_outage(jsonb_error.value)


def test_an_unreachable_database_is_an_outage():
    engine = make_engine("postgresql://nobody@127.0.0.1:1/none", pool_pre_ping=False)
    with pytest.raises(OperationalError) as exc, engine.connect():
        pass
    assert is_outage(exc.value)


class _Readiness:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.ready = False

    def set_ready(self) -> None:
        self.ready = True

    def set_unready(self, reason: str) -> None:
        self.ready = False
        self.reasons.append(reason)


def test_wait_out_retries_outages_reports_them_and_passes_other_errors():
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("down")
        return "up"

    r = _Readiness()
    assert wait_out("dep", flaky, readiness=r, backoff=Backoff(base_s=0.01)) == "up"
    assert len(calls) == 3 and r.ready and r.reasons == ["dep: ConnectionRefusedError"] * 2
    with pytest.raises(ValueError):
        wait_out("dep", lambda: (_ for _ in ()).throw(ValueError("bad input")))


def test_wait_out_is_bounded_by_a_deadline_and_by_stop():
    def down() -> None:
        raise ConnectionRefusedError("down")

    with pytest.raises(OutageOutlasted, match="still unavailable"):
        wait_out("dep", down, backoff=Backoff(base_s=0.01), deadline=time.monotonic() + 0.2)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(Stopped):
        wait_out("dep", down, stop=stop, backoff=Backoff(base_s=0.05, max_s=0.05))
