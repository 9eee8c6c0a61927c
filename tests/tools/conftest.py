"""Shared fixtures for tool tests: a context with a workspace, and a network guard.

`no_outside_network` (on for every test here) makes any connection to a non-loopback address fail
the test instead of leaving the machine, and lets a test give fake DNS answers (the resolver is
patched, so no DNS query is ever sent either).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.base import Attachment, ToolContext


def make_context(tmp_path: Path, attachments: tuple[Attachment, ...] = (), **kw) -> ToolContext:
    ws = tmp_path / "workspace"
    ws.mkdir(exist_ok=True)
    return ToolContext(
        task_id="t1",
        step_id="s1",
        attempt=1,
        idempotency_key=kw.pop("idempotency_key", "t1:s1:1"),
        workspace=ws,
        attachments=attachments,
        **kw,
    )


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return make_context(tmp_path)


class NetworkGuard:
    def __init__(self) -> None:
        self.dns: dict[str, list[str]] = {}
        self.connections: list[tuple[str, int]] = []
        self.lookups: list[str] = []


@pytest.fixture(autouse=True)
def no_outside_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkGuard]:
    guard = NetworkGuard()
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def checked_connect(self: socket.socket, address, *args):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6):
            ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
            if not ip.is_loopback:
                pytest.fail(f"test tried to connect to non-loopback address {address!r}")
            guard.connections.append((str(ip), int(address[1])))
        return real_connect(self, address, *args)

    def fake_getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = host.decode() if isinstance(host, bytes) else str(host)
        guard.lookups.append(name)
        try:
            ipaddress.ip_address(name)
        except ValueError:
            pass
        else:
            return real_getaddrinfo(host, port, *args, **kwargs)  # numeric: no DNS query
        if name not in guard.dns:
            raise socket.gaierror(socket.EAI_NONAME, f"test resolver: no record for {name}")
        out = []
        for addr in guard.dns[name]:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sockaddr = (addr, port, 0, 0) if fam == socket.AF_INET6 else (addr, port)
            out.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return out

    real_sendto = socket.socket.sendto

    def checked_sendto(self: socket.socket, data, *args):  # type: ignore[no-untyped-def]
        address = args[-1]
        inet = self.family in (socket.AF_INET, socket.AF_INET6)
        if inet and not ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback:
            pytest.fail(f"test tried to send a datagram to non-loopback address {address!r}")
        return real_sendto(self, data, *args)

    monkeypatch.setattr(socket.socket, "sendto", checked_sendto)
    monkeypatch.setattr(socket.socket, "connect", checked_connect)
    monkeypatch.setattr(
        socket.socket, "connect_ex", lambda *a, **k: pytest.fail("connect_ex is not expected")
    )
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    monkeypatch.setattr(
        socket, "create_connection", lambda *a, **k: pytest.fail("create_connection re-resolves")
    )
    yield guard
