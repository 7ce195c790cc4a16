"""Build trainyard's C extension modules in place, next to their sources.

* ``plugins/trainyard/staging/_native.c``: the small-files scanner and tar packer;
* ``plugins/trainyard/serving/_decode.c``: the float32 predict-request parser;
* ``plugins/trainyard/training/_loopback.c``: not a module but an ``LD_PRELOAD`` library
  (``_loopback.so``) that keeps the local training workers' gRPC servers on loopback.

Run by ``make`` before the demo, the tests and the benchmarks; rebuilds a module only when
its C source is newer. Without them everything still works through the slower Python
paths they are tested against (``sources._native`` / ``schema._decode`` are then None):
with no C compiler, or off Linux for the staging module (it uses Linux system calls),
this warns and goes on; a compiler that fails on the sources is an error. The preload
library has no Python fallback: without it the local launcher refuses to start workers.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "plugins" / "trainyard"
SOURCES = (
    PACKAGE / "staging" / "_native.c",
    PACKAGE / "serving" / "_decode.c",
    PACKAGE / "training" / "_loopback.c",
)
LINUX_ONLY = {"_native.c", "_loopback.c"}  # openat/fstatat/sync_file_range; LD_PRELOAD
PRELOAD = {"_loopback.c"}  # plain shared libraries, not Python modules


def target(source: Path) -> Path:
    """Where a built module goes: next to its source.

    A Python module gets this Python's extension suffix; a preload library is ``<stem>.so``.
    """
    if source.name in PRELOAD:
        return source.with_suffix(".so")
    return source.with_name(source.stem + str(sysconfig.get_config_var("EXT_SUFFIX")))


def main() -> int:
    """Build the modules that are not up to date; 0 on success, 1 when one cannot build."""
    return max((build(source) for source in SOURCES if source.exists()), default=0)


def build(source: Path) -> int:
    """Compile one module unless it is newer than its source."""
    out = target(source)
    if out.exists() and out.stat().st_mtime_ns >= source.stat().st_mtime_ns:
        return 0
    if source.name in LINUX_ONLY and not sys.platform.startswith("linux"):
        print(f"{source.name}: Linux only, the Python path runs instead", file=sys.stderr)
        return 0
    cc = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        instead = (
            "local training will refuse to start workers"
            if source.name in PRELOAD
            else "the slower Python path runs instead"
        )
        print(
            f"warning: no C compiler ({cc}): {source.name} not built, {instead} "
            "(install gcc or clang, then run make again)",
            file=sys.stderr,
        )
        return 0
    link = ["-bundle", "-undefined", "dynamic_lookup"] if sys.platform == "darwin" else ["-shared"]
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = [
        cc,
        "-O2",
        *link,
        "-fPIC",
        "-pthread",
        "-Wall",
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
        "-o",
        str(tmp),
        *(["-ldl"] if source.name in PRELOAD else []),
    ]
    print(f"building {out.name}: {shlex.join(cmd)}", file=sys.stderr)
    try:
        subprocess.run(cmd, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        tmp.unlink(missing_ok=True)
        print(f"cannot build {source.name}: {e}", file=sys.stderr)
        return 1
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
