"""What a set of processes listens on, read from ``/proc`` (Linux): no ``ss`` or ``lsof``."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except (FileNotFoundError, PermissionError):
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6 prints the address as four host-order (little-endian) 32-bit words
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listen_addresses(pids: list[int]) -> list[tuple[int, str, int]]:
    """Every TCP socket in LISTEN state that one of ``pids`` holds.

    Args:
        pids: Process ids (their network namespace's tables are read through the first).

    Returns:
        ``(pid, address, port)`` per listening socket, the address as text (``::``,
        ``127.0.0.1``, ``::ffff:127.0.0.1``, ...).
    """
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for pid in pids[:1]:
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except FileNotFoundError:
                continue
            for line in lines:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != _LISTEN or inode not in owner:
                    continue
                host, port = local.split(":")
                ip = _address(host)
                mapped = getattr(ip, "ipv4_mapped", None)
                text = f"::ffff:{mapped}" if mapped is not None else str(ip)
                found.append((owner[inode], text, int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    """Whether only this machine can reach an address (``::ffff:127.0.0.1`` counts)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
