"""The SSRF guard (`core.netguard`) as tools see it: a refusal is a permanent tool error the
model can read. The rule itself lives in `core.netguard`, shared with the inference server's
image fetching."""

from __future__ import annotations

from core import netguard
from core.netguard import IPAddress, embedded_ipv4, resolve
from tools.base import PermanentToolError

__all__ = [
    "AddressPolicy",
    "AddressRefusedError",
    "IPAddress",
    "embedded_ipv4",
    "resolve",
    "vetted_addresses",
]


class AddressRefusedError(PermanentToolError):
    """The destination is not one the tool may connect to."""


class AddressPolicy(netguard.AddressPolicy):
    """`core.netguard.AddressPolicy` whose refusals are `AddressRefusedError`."""

    def check(self, addr: IPAddress) -> None:
        try:
            super().check(addr)
        except netguard.AddressRefused as exc:
            raise AddressRefusedError(str(exc), details=exc.details) from None


def vetted_addresses(host: str, port: int, policy: netguard.AddressPolicy) -> list[IPAddress]:
    """`core.netguard.vetted_addresses`, refusing with `AddressRefusedError`."""
    try:
        return netguard.vetted_addresses(host, port, policy)
    except netguard.AddressRefused as exc:
        raise AddressRefusedError(str(exc), details=exc.details) from None
