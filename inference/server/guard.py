"""The server's front door, before any route runs: the API key, then `core.frontdoor` (load
shedding, the body's size and time, the JSON nesting), with errors in OpenAI's shape.

The API key works as vLLM's does: `--api-key` or DAYZERO_INFERENCE_API_KEY; every `/v1/*`
request must send `Authorization: Bearer <key>`; `/health` and `/metrics` stay open for probes
and scrapers. The comparison is constant-time (`hmac.compare_digest`), so response timing does
not reveal how much of a guess was right. A request without the key takes no slot.

Admission: at most `max_in_flight` requests are in flight (the engine's `max_num_seqs` by
default: a streamed answer holds its slot to its last token) and at most `max_queue` wait for a
slot, each at most `max_queue_wait_s` (estimated from how long slots are held, then actual);
the rest are answered 429 + `Retry-After` before their body is read or tokenized, so the
engine's own waiting queue stays short and an admitted request's time to first token bounded.
A dead engine is answered 503 + `Retry-After` by the same door.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.frontdoor import FrontDoor, FrontDoorLimits

PROTECTED_PATHS = ("/v1/", "/tokenize", "/detokenize")
EXEMPT_PATHS = ("/health", "/metrics")
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # room for inline base64 images
DEFAULT_MAX_JSON_DEPTH = 32


@dataclass(frozen=True, slots=True)
class ServerLimits:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_in_flight: int = 0  # 0: no shedding (`dayzero infer serve` sets it to max_num_seqs)
    max_queue: int = 0
    max_queue_wait_s: float = 0.1
    body_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key must not be empty (leave it unset to serve without one)")
        self.front_door()  # the door's own checks

    def front_door(self) -> FrontDoorLimits:
        return FrontDoorLimits(
            max_body_bytes=self.max_body_bytes,
            max_json_depth=self.max_json_depth,
            body_timeout_s=self.body_timeout_s,
            max_in_flight=self.max_in_flight,
            max_queue=self.max_queue,
            max_queue_wait_s=self.max_queue_wait_s,
            exempt_prefixes=EXEMPT_PATHS,
        )


def key_matches(header: bytes | None, api_key: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <key>` header value."""
    if header is None or not header.startswith(b"Bearer "):
        return False
    return hmac.compare_digest(header[len(b"Bearer ") :].strip(), api_key.encode())


_TYPES = {401: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}
_CODES = {
    "body-too-large": "request_too_large",
    "body-too-deep": "invalid_json",
    "body-timeout": "request_timeout",
    "overloaded": "server_overloaded",
    "unavailable": "engine_unavailable",
}


def openai_error(status: int, code: str, message: str, path: str = "") -> tuple[str, bytes]:
    """A refusal as an OpenAI-style error body."""
    err = {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": None}
    err["code"] = _CODES.get(code, code)
    return "application/json", json.dumps({"error": err}).encode()


class Guard:
    """Pure ASGI middleware: the API key on /v1/* and the tokenizer routes, then the front door."""

    def __init__(self, app: Any, limits: ServerLimits, ready: Callable[[], bool] | None = None) -> None:
        self.limits = limits
        self.door = FrontDoor(app, limits.front_door(), openai_error, ready=ready)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        key = self.limits.api_key
        if scope["type"] == "http" and key is not None and scope["path"].startswith(PROTECTED_PATHS):
            auth = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
            if not key_matches(auth, key):
                _, body = openai_error(401, "invalid_api_key", "invalid or missing API key")
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.door(scope, receive, send)
