"""localkube's pod network for the Python in a pod: cluster DNS and Service ports.

The kubelet puts this folder on a pod process's ``PYTHONPATH``. A name of a Service with
ready endpoints (``<svc>``, ``<svc>.<ns>``, ``<svc>.<ns>.svc[.cluster.local]``) and one of
its ports resolves to the loopback port of a ready pod behind it, as cluster DNS and
kube-proxy would route it; with no ready endpoint the connection is refused. The table is
the controllers' (``LOCALKUBE_NETWORK``), read on each lookup. Other names resolve as usual.
"""

from __future__ import annotations

import json
import os
import socket

_real_getaddrinfo = socket.getaddrinfo
_REFUSED = 1  # nothing listens on tcpmux: connect() is refused, as with no endpoints


def _lookup(host: object, port: object) -> tuple[str, int] | None:
    if not isinstance(host, str) or not os.environ.get("LOCALKUBE_NETWORK"):
        return None
    name = host.rstrip(".")
    ns = os.environ.get("LOCALKUBE_NAMESPACE", "default")
    try:
        with open(os.environ["LOCALKUBE_NETWORK"], encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        return None
    for key in (f"{name}:{port}", f"{name}.{ns}:{port}"):
        if key in table:
            ends = table[key]
            if not ends:
                return ("127.0.0.1", _REFUSED)
            end = ends[hash(os.getpid()) % len(ends)]
            host_, _, port_ = end.rpartition(":")
            return (host_, int(port_))
    return None


def _getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
    found = _lookup(host, port)
    if found is None:
        return _real_getaddrinfo(host, port, family, type, proto, flags)
    return _real_getaddrinfo(found[0], found[1], family, type, proto, flags)


socket.getaddrinfo = _getaddrinfo
