"""Time, in one place (aware UTC datetimes everywhere)."""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def after(seconds: float) -> dt.datetime:
    return utcnow() + dt.timedelta(seconds=seconds)
