"""Column types that behave the same on PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Integer
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

# JSONB on PostgreSQL (indexable, compact), JSON text on SQLite.
JSONType = JSON().with_variant(JSONB(), "postgresql")
# JSON text on both: for small documents written once and read whole (the outbox payloads),
# compact text is ~40% smaller than JSONB's binary form (per-key headers, numerics), so WAL too.
JSONText = JSON()
# SQLite only auto-increments an INTEGER PRIMARY KEY.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite stores naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use orchestrator.clock.utcnow()")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
