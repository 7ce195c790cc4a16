"""Build trainyard's C extension, ``plugins/trainyard/staging/_native.c``, in place.

Run by ``make`` before the demo, the tests and the benchmarks; rebuilds only when the C
source is newer than the built module. Without the module staging still works, through
the slower pure-Python path (``trainyard.staging.native`` says which one runs).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "plugins" / "trainyard" / "staging" / "_native.c"


def target() -> Path:
    """Where the built module goes: next to its source, with this Python's suffix."""
    return SOURCE.with_name("_native" + str(sysconfig.get_config_var("EXT_SUFFIX")))


def main() -> int:
    """Build the module unless it is up to date; 0 on success, 1 when it cannot build."""
    out = target()
    if out.exists() and out.stat().st_mtime_ns >= SOURCE.stat().st_mtime_ns:
        return 0
    cc = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = [
        cc,
        "-O2",
        "-shared",
        "-fPIC",
        "-pthread",
        "-Wall",
        "-Werror",
        f"-I{sysconfig.get_paths()['include']}",
        str(SOURCE),
        "-o",
        str(tmp),
    ]
    print(f"building {out.name}: {shlex.join(cmd)}", file=sys.stderr)
    try:
        subprocess.run(cmd, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        tmp.unlink(missing_ok=True)
        print(f"cannot build {SOURCE.name}: {e}", file=sys.stderr)
        return 1
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
