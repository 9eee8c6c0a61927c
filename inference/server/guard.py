"""The server's front door, before any route runs: the API key and the request body's size.

The API key works as vLLM's does: `--api-key` or DAYZERO_INFERENCE_API_KEY; every `/v1/*`
request must send `Authorization: Bearer <key>`; `/health` and `/metrics` stay open for probes
and scrapers. The comparison is constant-time (`hmac.compare_digest`), so response timing does
not reveal how much of a guess was right.

The size limit counts bytes as they arrive (a missing or lying Content-Length included) and
answers 413 before the body is buffered, parsed or tokenized.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

PROTECTED_PATHS = ("/v1/", "/tokenize", "/detokenize")
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # room for inline base64 images
DEFAULT_MAX_JSON_DEPTH = 32


@dataclass(frozen=True, slots=True)
class ServerLimits:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key must not be empty (leave it unset to serve without one)")
        if self.max_body_bytes < 1024 or self.max_json_depth < 4:
            raise ValueError("max_body_bytes must be >= 1024 and max_json_depth >= 4")


def key_matches(header: bytes | None, api_key: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <key>` header value."""
    if header is None or not header.startswith(b"Bearer "):
        return False
    return hmac.compare_digest(header[len(b"Bearer ") :].strip(), api_key.encode())


async def _send_error(send: Any, status: int, message: str, type_: str, code: str | None) -> None:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Pure ASGI middleware: API key on /v1/* and the tokenizer routes, then the body size limit."""

    def __init__(self, app: Any, limits: ServerLimits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lim = self.limits
        if lim.api_key is not None and scope["path"].startswith(PROTECTED_PATHS):
            auth = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
            if not key_matches(auth, lim.api_key):
                await _send_error(
                    send, 401, "invalid or missing API key", "invalid_request_error", "invalid_api_key"
                )
                return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > lim.max_body_bytes:
                await self._too_large(send)
                return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        # Read whole here (every route reads the whole body anyway), counting as it arrives.
        chunks, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > lim.max_body_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        await _send_error(
            send,
            413,
            f"request bodies are limited to {self.limits.max_body_bytes} bytes",
            "invalid_request_error",
            "request_too_large",
        )
