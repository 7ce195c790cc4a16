"""Free loopback ports for servers the tests start: one implementation for the suite.

Ports come from a band below Linux's ephemeral range (``ip_local_port_range`` starts at
32768), so an outgoing connection never takes one between the pick and the bind, and each
pytest-xdist worker has a band of its own, so two workers never pick the same port. A
port is handed out once per process. Each pick is checked by binding it.
"""

from __future__ import annotations

import os
import random
import socket

_BAND = 3000
_FIRST = 20000  # bands: 20000.. (no xdist), 23000.. (gw0), 26000.. (gw1), ...
_given: set[int] = set()


def _band() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    start = _FIRST + (index % 4) * _BAND
    return range(start, start + _BAND)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, besides: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``n`` distinct free loopback ports, none of ``besides`` and none handed out before.

    Picked one at a time and released, two ports could come out the same: the triggerer's
    log server once took the API server's port and standalone never answered. Ports are
    never handed out twice here.
    """
    band = list(_band())
    random.shuffle(band)
    ports: list[int] = []
    for port in band:
        if port in _given or port in besides or not _bindable(port):
            continue
        ports.append(port)
        _given.add(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free ports left in {_band()}")


def free_port() -> int:
    """One free loopback port (see :func:`free_ports`)."""
    return free_ports(1)[0]
