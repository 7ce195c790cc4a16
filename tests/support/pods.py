"""The local runner's pod processes, found by what they run rather than by who started them.

A pod process may be a fork of :mod:`trainyard.forkserver`: then it is no descendant of the
launcher that asked for it, and only its argv (``python -m trainyard <command> ...``) and
the paths in it say whose it is.
"""

from __future__ import annotations

from pathlib import Path

import psutil


def pod_processes(marker: Path | str, command: str | None = None) -> list[psutil.Process]:
    """Running ``python -m trainyard`` processes whose argv mentions ``marker``.

    Args:
        marker: A path or word of the test's own (its volume root), in the argv.
        command: Only this command's processes (``worker``), if given.

    Returns:
        The processes (zombies excluded: they have ended).
    """
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            argv = p.info["cmdline"] or []
            if argv[1:3] != ["-m", "trainyard"] or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if (command is None or argv[3:4] == [command]) and str(marker) in " ".join(argv):
                found.append(p)
        except psutil.Error:
            continue
    return found
