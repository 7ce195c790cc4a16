"""Build a C module of trainyard with AddressSanitizer and UBSan, and run Python on it.

Python itself is not instrumented, so ASan's runtime is preloaded, and Python takes every
object from malloc (not its own pools), so that a read past a small bytes object is
caught too; leaks are Python's and not reported. Any out-of-bounds access, use after
free or undefined behaviour aborts the child process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sanitized_build(source: Path, folder: Path) -> Path:
    """``source`` built with ASan and UBSan into ``folder``, named as the module's file."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    assert cc, "a C compiler is required (the C modules are built by make)"
    out = folder / (source.stem + str(sysconfig.get_config_var("EXT_SUFFIX")))
    cmd = [
        cc, "-O1", "-g", "-shared", "-fPIC", "-pthread", "-Wall",
        "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
        "-fno-omit-frame-pointer", f"-I{sysconfig.get_paths()['include']}",
        str(source), "-o", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def run_sanitized(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python -c code args...`` with ASan's runtime preloaded (Linux only)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("AddressSanitizer preload is set up for Linux here")
    libasan = subprocess.run(
        [shutil.which("gcc") or "gcc", "-print-file-name=libasan.so"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(libasan).is_file(), "libasan is required for the sanitized build"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        "LD_PRELOAD": libasan,
        # every object from malloc, so that ASan sees the bounds of small ones too
        "PYTHONMALLOC": "malloc",
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
