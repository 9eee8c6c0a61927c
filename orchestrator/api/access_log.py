"""The API's access log: one line per request on the `dayzero.access` logger, when the response
has been sent (an event stream: when it ends).

`method path status ms bytes client`, nothing else: no headers (the API key travels in
`Authorization`), no query string (filters may carry tenants' metadata values), no body. The line
is written by `orchestrator.logs.BackgroundHandler`'s thread, not the request's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("dayzero.access")


class AccessLog:
    """Pure ASGI middleware around the whole app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status, sent = 0, 0

        async def counting_send(msg: dict) -> None:
            nonlocal status, sent
            if msg["type"] == "http.response.start":
                status = msg["status"]
            elif msg["type"] == "http.response.body":
                sent += len(msg.get("body", b""))
            await send(msg)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            client = scope.get("client")
            log.info(
                "request",
                extra={
                    "kv": {
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status or "none",  # none: the client left before a response
                        "ms": (time.perf_counter() - t0) * 1000,
                        "bytes": sent,
                        "client": client[0] if client else None,
                    }
                },
            )
