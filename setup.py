"""trainyard's C extensions (the rest of the package is declared in ``pyproject.toml``).

setuptools builds compiled code only from ``setup.py``; ``pip install .`` (the images),
``pip install -e .`` (``make``: built in place, next to the sources, where Airflow's
plugins folder and ``PYTHONPATH=plugins`` import them) and ``pip wheel .`` all run it.

* ``trainyard.staging._native``: the small-files scanner and tar packer (Linux only:
  ``openat``/``fstatat``/``sync_file_range``);
* ``trainyard.training._loopback``: not a module but an ``LD_PRELOAD`` library,
  ``_loopback.so``, that keeps the local training workers' gRPC servers on loopback
  (Linux only).

Every extension is optional: a failed build (no compiler, a broken one) is a loud warning,
not a failed install. The modules then import as None and the slower Python paths they are
tested against run instead, each warning once at import; without the preload library the
local launcher refuses to start workers.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

LINUX = sys.platform.startswith("linux")
PRELOAD = "trainyard.training._loopback"
CFLAGS = ["-O2", "-pthread", "-Wall"]


class BuildExt(build_ext):
    """``build_ext`` that names the preload library ``_loopback.so`` (no ABI suffix)."""

    def get_ext_filename(self, fullname: str) -> str:
        """The built file's path; a plain ``<stem>.so`` for the preload library."""
        # distutils asks with the last name only, setuptools with the full one
        if fullname in (PRELOAD, PRELOAD.rsplit(".", 1)[1]):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        """Exported symbols; the preload library has no ``PyInit_`` function."""
        return ext.export_symbols if ext.name == PRELOAD else super().get_export_symbols(ext)


def extensions() -> list[Extension]:
    """The extensions this platform builds, all optional."""
    out: list[Extension] = []
    if LINUX:
        out += [
            Extension(
                "trainyard.staging._native",
                ["plugins/trainyard/staging/_native.c"],
                extra_compile_args=CFLAGS,
                extra_link_args=["-pthread"],
                optional=True,
            ),
            Extension(
                PRELOAD,
                ["plugins/trainyard/training/_loopback.c"],
                extra_compile_args=CFLAGS,
                libraries=["dl"],
                optional=True,
            ),
        ]
    return out


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
