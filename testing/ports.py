"""Loopback ports for processes the tests start."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port_pair() -> int:
    """A port p with p and p + 1 both free (a rendezvous port and the control port beside it),
    taken below the ephemeral range: on a busy host outgoing connections take ephemeral ports at
    any moment, so the port next to an ephemeral one may be gone by the time a server binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except OSError:  # not Linux: the IANA dynamic range
        low = 49152
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, low - 2)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports below the ephemeral range")
