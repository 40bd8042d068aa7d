"""Free loopback ports for the servers the tests start.

A port from bind(("127.0.0.1", 0)) comes from the kernel's ephemeral range, which is also
where every outgoing connection's local port comes from: between the pick and the server's
own bind, another worker's client could take it (an ActiveMQ then failed to bind and its
test waited 90 s for the port). So the pick is random, below that range, and checked free.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
_pick = random.Random(os.urandom(16))  # not the global one: hypothesis seeds that


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = HOST) -> int:
    """A port on ``host`` nothing is bound to, outside the ephemeral range when it can be."""
    low = _ephemeral_low()
    for _ in range(100 if low > 12000 else 0):
        port = _pick.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
