"""Structured one-line logs, written off the hot path.

Every line is logfmt (`ts=… level=info logger=dayzero.task msg=task.step task=… step=3 …`), which
Loki, Grafana, `grep` and `jq -R` all read. Call sites pass their fields as
`extra={"kv": {...}}`; `BackgroundHandler` hands each record to a thread that formats and
writes it, so a request or a step never waits for stderr (a slow pipe or a full pod log buffer
stalls that thread, not the work).

`dayzero runner` and `dayzero serve` log through it: `setup()` for the root logger of a process,
`uvicorn_log_config()` for the API's worker processes (uvicorn applies it in each).
"""

from __future__ import annotations

import datetime as dt
import logging
import logging.handlers
import queue
import sys
from typing import Any, TextIO

__all__ = ["BackgroundHandler", "LogfmtFormatter", "setup", "uvicorn_log_config"]


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:.1f}"
    s = str(v)
    if s and not any(c in s for c in ' ="\\\n\t'):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


class LogfmtFormatter(logging.Formatter):
    """`ts=<UTC ISO 8601> level=<name> logger=<name> msg=<message> <kv fields>` on one line
    (a traceback, if any, is folded into an `exc` field)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
        fields: dict[str, Any] = {
            "ts": ts.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update(getattr(record, "kv", None) or {})
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return " ".join(f"{k}={_value(v)}" for k, v in fields.items())


class BackgroundHandler(logging.handlers.QueueHandler):
    """Puts records on an in-memory queue; a listener thread formats them and writes `stream`."""

    def __init__(self, stream: TextIO | None = None) -> None:
        q: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        super().__init__(q)
        out = logging.StreamHandler(stream or sys.stderr)
        out.setFormatter(LogfmtFormatter())
        self.listener = logging.handlers.QueueListener(q, out)
        self.listener.start()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The listener runs in this process, so the record goes as it is; formatting it (the
        # base class does it here, on the caller's thread) is the listener's job.
        return record

    def close(self) -> None:
        # logging.shutdown() closes every handler at exit: stopping drains the queue, so the
        # last lines (a task's end, the stop) are written before the process goes.
        if self.listener._thread is not None:  # closed once already
            self.listener.stop()
        super().close()


def setup(level: int | str = logging.INFO) -> None:
    """Log every logger of this process through one `BackgroundHandler` on stderr."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(BackgroundHandler())
    root.setLevel(level)
    # A line per HTTP call to the model server or the API is noise next to the step lines.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """A `logging.dictConfig` for `dayzero serve`: uvicorn's and dayzero's loggers (the access log
    is `dayzero.access`) through one background handler, in every worker process."""
    handler = {"()": "orchestrator.logs.BackgroundHandler"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"background": handler},
        "loggers": {
            name: {"handlers": ["background"], "level": level.upper(), "propagate": False}
            for name in ("uvicorn", "uvicorn.error", "dayzero", "orchestrator")
        },
    }
