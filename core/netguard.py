"""Outbound address vetting for everything that fetches a URL a request named (SSRF defence):
the `http_get` tool and the inference server's image URLs use this one guard.

Host names are resolved once, every resolved address is vetted, and the caller connects to the
vetted address itself, so a second (rebinding) DNS answer never reaches the socket layer.
IPv6 forms that embed an IPv4 address (IPv4-mapped, IPv4-compatible, 6to4, Teredo, NAT64) are
judged by the IPv4 address they carry.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPAT = ipaddress.ip_network("::/96")
# Never reachable, whatever the allow-list says: cloud metadata lives on link-local addresses.
_ALWAYS_REFUSED = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::/32"),  # AWS IPv6 metadata endpoint block
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud metadata
    ipaddress.ip_network("192.0.0.192/32"),  # Oracle Cloud metadata
)


class AddressRefused(ValueError):
    """The destination may not be connected to (`details` says why): a request for another URL
    may succeed, this one never will."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]  # the client address
    if addr in _NAT64 or addr in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _IPV4_COMPAT and int(addr) > 1:  # ::a.b.c.d (deprecated, still routable on some stacks)
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


class AddressPolicy:
    """Public unicast addresses pass; `allow_networks` opens private/loopback ranges explicitly."""

    def __init__(self, allow_networks: Iterable[str] = ()) -> None:
        self.allowed = tuple(ipaddress.ip_network(n, strict=False) for n in allow_networks)
        for net in self.allowed:
            if any(net.version == bad.version and net.overlaps(bad) for bad in _ALWAYS_REFUSED):
                raise ValueError(f"allow_networks may not include link-local or metadata ranges: {net}")

    def check(self, addr: IPAddress) -> None:
        """Raise `AddressRefusedError` unless `addr` may be connected to."""
        reason = self.refusal(addr)
        if reason:
            raise AddressRefused(
                f"refused to connect to {addr}: {reason}", details={"address": str(addr), "reason": reason}
            )

    def refusal(self, addr: IPAddress) -> str | None:
        if isinstance(addr, ipaddress.IPv6Address):
            if addr.scope_id:
                return "scoped IPv6 address"
            inner = embedded_ipv4(addr)
            if inner is not None:
                reason = self.refusal(inner)
                return f"embeds {inner}, {reason}" if reason else None
        if any(addr.version == n.version and addr in n for n in _ALWAYS_REFUSED) or addr.is_link_local:
            return "link-local / cloud metadata address"
        if addr.is_multicast:
            return "multicast address"
        if addr.is_unspecified:
            return "unspecified address"
        if addr.is_reserved or (addr.version == 4 and addr == ipaddress.IPv4Address("255.255.255.255")):
            return "reserved address"
        if any(addr.version == n.version and addr in n for n in self.allowed):
            return None
        if addr.is_loopback:
            return "loopback address (not allow-listed)"
        if addr.is_private or not addr.is_global:
            return "private or non-global address (not allow-listed)"
        return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """All addresses `host` resolves to (an IP literal resolves to itself, without DNS)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise AddressRefused(f"cannot resolve {host!r}: {exc}", details={"reason": "dns"}) from None
    out: list[IPAddress] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        addr = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if family == socket.AF_INET6 and sockaddr[3]:
            addr = ipaddress.IPv6Address(f"{addr}%{sockaddr[3]}")
        if addr not in out:
            out.append(addr)
    if not out:
        raise AddressRefused(f"{host!r} has no IPv4/IPv6 address", details={"reason": "dns"})
    return out


def vetted_addresses(host: str, port: int, policy: AddressPolicy) -> list[IPAddress]:
    """Resolve and vet; refuses when *any* answer is refused (a mixed answer is a rebinding tell)."""
    addrs = resolve(host, port)
    for addr in addrs:
        policy.check(addr)
    return addrs


class AllowList:
    """Entries: "host", "*.suffix" (ports 80/443) or "host:port", "[v6]:port" (that port only)."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        self.rules: list[tuple[str, int | None]] = []
        for raw in entries:
            entry = raw.strip().lower()
            host, port = entry, None
            if entry.startswith("["):
                host, _, rest = entry[1:].partition("]")
                port = int(rest[1:]) if rest.startswith(":") else None
            elif entry.count(":") == 1:
                host, p = entry.split(":")
                port = int(p)
            if not host:
                raise ValueError(f"bad http allow-list entry {raw!r}")
            self.rules.append((host.rstrip("."), port))

    def allows(self, host: str, port: int) -> bool:
        host = host.rstrip(".")
        for rule_host, rule_port in self.rules:
            if rule_port is None and port not in (80, 443):
                continue
            if rule_port is not None and port != rule_port:
                continue
            if rule_host.startswith("*."):
                if host.endswith(rule_host[1:]) and host != rule_host[2:]:
                    return True
            elif host == rule_host:
                return True
        return False


class PinnedConnection(http.client.HTTPConnection):
    """HTTP to a pre-vetted address: `connect()` never resolves the host name again."""

    def __init__(self, host: str, port: int, address: IPAddress, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        family = socket.AF_INET6 if self._address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect((str(self._address), self.port))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class PinnedTLSConnection(PinnedConnection):
    """TLS to the vetted address; the certificate is still verified against the host *name*."""

    def __init__(
        self, host: str, port: int, address: IPAddress, timeout: float, context: ssl.SSLContext
    ) -> None:
        super().__init__(host, port, address, timeout)
        self._context = context

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


def abort_connection(conn: http.client.HTTPConnection) -> None:
    """Shut the connection's socket down (from a watchdog thread): a blocked read returns at once."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
