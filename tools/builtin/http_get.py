"""`http_get`: fetch a URL from an allow-list, with SSRF defences, size and time caps.

Per hop (the first request and every redirect): the URL must be http(s) without credentials, its
host and port must match the allow-list, the host is resolved once and every address vetted by
`core.netguard` (through `tools.netguard`), and the socket connects to that vetted address (TLS still verifies the host
name). Nothing is sent anywhere before all of that has passed.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from core.netguard import AllowList, PinnedConnection, PinnedTLSConnection, abort_connection, is_ip
from tools.base import (
    InvalidArgumentsError,
    PermanentToolError,
    RetryableToolError,
    RetryPolicy,
    ToolContext,
    ToolResult,
    ToolSpec,
    ToolTimeoutError,
)
from tools.config import HttpConfig
from tools.netguard import AddressPolicy, AddressRefusedError, IPAddress, vetted_addresses

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
TEXT_TYPES = (
    "text/",
    "application/json",
    "application/xml",
    "application/xhtml+xml",
    "application/javascript",
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class HostNotAllowedError(AddressRefusedError):
    """The URL's host or port is not on the configured allow-list."""


class HttpGetTool:
    def __init__(self, config: HttpConfig) -> None:
        if not config.allow_hosts:
            raise ValueError("http_get needs a non-empty allow-list (HttpConfig.allow_hosts)")
        self.config = config
        self.allow = AllowList(config.allow_hosts)
        self.policy = AddressPolicy(config.allow_networks)
        self._tls = ssl.create_default_context(cafile=config.ca_file)
        self.spec = ToolSpec(
            name="http_get",
            description=(
                "HTTP GET of a URL on the configured allow-list ("
                + ", ".join(config.allow_hosts[:20])
                + f"). Redirects are followed (at most {config.max_redirects}), each re-checked; the body is "
                f"cut at {config.max_bytes} bytes. Text comes back as text, anything else as base64."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "url": {"type": "string", "minLength": 8, "maxLength": 4096, "pattern": "^https?://"}
                },
                "required": ["url"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "properties": {
                    "url": {"type": "string"},
                    "status": {"type": "integer"},
                    "content_type": {"type": ["string", "null"]},
                    "body": {"type": "string"},
                    "body_encoding": {"enum": ["text", "base64"]},
                    "truncated": {"type": "boolean"},
                    "redirects": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["url", "status", "body", "body_encoding", "truncated", "redirects"],
            },
            retry=RetryPolicy(max_attempts=3, backoff_base_s=1.0, timeout_s=config.timeout_s + 5.0),
            idempotent=True,  # GET only
            resources=("network",),
            max_argument_bytes=8 * 1024,
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        timeout = self.config.timeout_s
        if context.deadline_s is not None:
            timeout = max(0.1, min(timeout, context.deadline_s - 0.5))
        deadline = time.monotonic() + timeout
        url, redirects = arguments["url"], []
        while True:
            status, headers, body, truncated, location = self._fetch_once(url, deadline)
            if status in REDIRECT_STATUSES and location:
                if len(redirects) >= self.config.max_redirects:
                    raise PermanentToolError(
                        f"more than {self.config.max_redirects} redirects", details={"url": url}
                    )
                redirects.append(url)
                url = urljoin(url, location)
                continue
            break
        ctype = headers.get("content-type")
        is_text = ctype is None or ctype.lower().startswith(TEXT_TYPES)
        charset = _charset(ctype) if is_text else None
        return ToolResult(
            content={
                "url": url,
                "status": status,
                "content_type": ctype,
                "body": body.decode(charset or "utf-8", errors="replace")
                if is_text
                else base64.b64encode(body).decode(),
                "body_encoding": "text" if is_text else "base64",
                "truncated": truncated,
                "redirects": redirects,
            }
        )

    def check_url(self, url: str) -> tuple[str, str, int, str, list[IPAddress]]:
        """Everything decided before a connection: (scheme, host, port, request target, addresses)."""
        if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
            raise InvalidArgumentsError("URL contains whitespace or control characters; percent-encode them")
        try:
            parts = urlsplit(url)
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
        except ValueError as exc:
            raise InvalidArgumentsError(f"malformed URL: {exc}") from None
        if parts.scheme not in _DEFAULT_PORTS or port is None:
            raise AddressRefusedError(
                f"only http and https URLs are allowed, not {parts.scheme!r}", details={"url": url}
            )
        if parts.username is not None or parts.password is not None:
            raise AddressRefusedError("URLs with credentials are not allowed", details={"url": url})
        host = (parts.hostname or "").lower()
        if not host:
            raise InvalidArgumentsError(f"URL {url!r} has no host")
        try:
            host_ascii = host if is_ip(host) else host.encode("idna").decode("ascii")
        except UnicodeError:
            raise AddressRefusedError(f"host {host!r} is not a valid name", details={"url": url}) from None
        if not self.allow.allows(host_ascii, port):
            raise HostNotAllowedError(
                f"{host_ascii}:{port} is not on the http allow-list",
                details={"url": url, "reason": "allow-list"},
            )
        addresses = vetted_addresses(host_ascii, port, self.policy)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return parts.scheme, host_ascii, port, target, addresses

    def _fetch_once(self, url: str, deadline: float) -> tuple[int, dict[str, str], bytes, bool, str | None]:
        scheme, host, port, target, addresses = self.check_url(url)
        last_exc: Exception | None = None
        for address in addresses[:2]:  # all vetted; try the next one only on a connect failure
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            conn = (
                PinnedTLSConnection(host, port, address, remaining, self._tls)
                if scheme == "https"
                else PinnedConnection(host, port, address, remaining)
            )
            try:
                conn.connect()
            except ssl.SSLCertVerificationError as exc:
                conn.close()  # a wrong certificate stays wrong: do not retry
                raise PermanentToolError(
                    f"TLS certificate of {host} not accepted: {exc.verify_message}",
                    details={"url": url},
                    started=False,
                ) from None
            except OSError as exc:  # ssl.SSLError is an OSError
                conn.close()
                last_exc = exc
                continue
            try:
                return self._exchange(conn, host, port, scheme, target, deadline)
            finally:
                conn.close()
        if isinstance(last_exc, TimeoutError) or time.monotonic() >= deadline:
            raise ToolTimeoutError(f"connecting to {host} timed out", details={"url": url}, started=False)
        raise RetryableToolError(
            f"cannot connect to {host}:{port}: {last_exc}", details={"url": url}, started=False
        )

    def _exchange(
        self, conn: PinnedConnection, host: str, port: int, scheme: str, target: str, deadline: float
    ) -> tuple[int, dict[str, str], bytes, bool, str | None]:
        host_header = host if port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            host_header = f"[{host}]" if port == _DEFAULT_PORTS[scheme] else f"[{host}]:{port}"
        # A watchdog enforces the deadline on the whole exchange: per-recv socket timeouts alone let
        # a server trickle headers one byte at a time for ever.
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), abort_connection, args=(conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
            for k, v in (
                ("Host", host_header),
                ("User-Agent", self.config.user_agent),
                ("Accept-Encoding", "identity"),  # no compression bombs
                ("Connection", "close"),
            ):
                conn.putheader(k, v)
            conn.endheaders()
            resp = conn.getresponse()
            headers = {k.lower(): v for k, v in resp.getheaders()}
            body, truncated = bytearray(), False
            if resp.status not in REDIRECT_STATUSES:
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ToolTimeoutError(
                            f"reading from {host} took longer than {self.config.timeout_s:g} s"
                        )
                    if conn.sock is not None:
                        conn.sock.settimeout(remaining)
                    chunk = resp.read1(
                        min(65536, self.config.max_bytes + 1 - len(body))
                    )  # no waiting for a full buffer
                    if not chunk:
                        if time.monotonic() >= deadline:  # the watchdog's shutdown reads as an end
                            raise ToolTimeoutError(
                                f"reading from {host} took longer than {self.config.timeout_s:g} s"
                            )
                        # The server closed before the length it declared: a partial body.
                        declared = headers.get("content-length", "")
                        truncated = declared.isdigit() and len(body) < int(declared)
                        break
                    body += chunk
                    if len(body) > self.config.max_bytes:
                        del body[self.config.max_bytes :]
                        truncated = True
                        break
            return resp.status, headers, bytes(body), truncated, headers.get("location")
        except (http.client.HTTPException, OSError, ValueError) as exc:
            if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
                raise ToolTimeoutError(f"{host} did not answer within {self.config.timeout_s:g} s") from None
            raise RetryableToolError(
                f"HTTP exchange with {host} failed: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            watchdog.cancel()


def _charset(ctype: str | None) -> str | None:
    if not ctype:
        return None
    for part in ctype.split(";")[1:]:
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v:
            name = v.strip('"').strip()
            try:
                "".encode(name)
            except LookupError:
                return None
            return name
    return None
