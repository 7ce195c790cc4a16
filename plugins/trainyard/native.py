"""trainyard's C extensions: loaded when built, a loud warning and the Python path when not.

``setup.py`` builds them (``pip install .``, ``pip install -e .`` in place for ``make``);
each is optional, so an install without a working C compiler succeeds with the slower
Python paths the C code is tested against. ``python -m trainyard.native`` lists what is
built (``make native`` runs it after building).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType

LINUX = sys.platform.startswith("linux")

MODULES = {
    "trainyard.staging._native": "the Python scanner and packer stage alone",
}
"""Extension modules and what runs when one is not built."""

LIBRARIES = {
    "trainyard.training._loopback": "local training refuses to start workers",
}
"""Plain shared libraries (``<name>.so``, not modules) and what happens without them."""

LINUX_ONLY = frozenset({"trainyard.staging._native", "trainyard.training._loopback"})
"""Built on Linux only (Linux system calls; ``LD_PRELOAD``)."""

REBUILD = "rebuild with `make native` (pip install -e .; needs a C compiler such as gcc)"


def load(name: str) -> ModuleType | None:
    """Import a C extension module, or warn once, naming it, and return None.

    Args:
        name: Dotted module name, one of :data:`MODULES`.

    Returns:
        The module; None when it is not built (off Linux for a Linux-only one, silently).
    """
    if name in LINUX_ONLY and not LINUX:
        return None
    try:
        return importlib.import_module(name)
    except ImportError as e:
        warnings.warn(
            f"{name} is not built ({e}): {MODULES[name]} (slower); {REBUILD}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def built_path(name: str) -> Path | None:
    """The built file of an extension of :data:`MODULES` or :data:`LIBRARIES`, if any.

    Beside its C source: ``<stem><ABI suffix>`` for a module, ``<stem>.so`` for a library.
    """
    package, _, stem = name.rpartition(".")
    folder = Path(__file__).resolve().parent.joinpath(*package.split(".")[1:])
    suffixes = [".so"] if name in LIBRARIES else importlib.machinery.EXTENSION_SUFFIXES
    return next((folder / (stem + s) for s in suffixes if (folder / (stem + s)).is_file()), None)


def missing() -> list[str]:
    """What this platform should have built and has not (or is stale), one line each.

    A module is loaded from its file alone (not through its package, whose imports may
    need the dependencies), so this also catches a file built for another Python.
    """
    out = []
    for name, instead in {**MODULES, **LIBRARIES}.items():
        if name in LINUX_ONLY and not LINUX:
            continue
        path = built_path(name)
        source = Path(__file__).resolve().parent.joinpath(*name.split(".")[1:]).with_suffix(".c")
        if path is None:
            out.append(f"{name} is not built: {instead}")
            continue
        if source.is_file() and path.stat().st_mtime_ns < source.stat().st_mtime_ns:
            out.append(f"{path} is older than {source.name} (its last build failed?)")
        if name in MODULES:
            try:
                spec = importlib.util.spec_from_file_location(name, path)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))  # type: ignore[union-attr]
            except ImportError as e:
                out.append(f"{path} does not load ({e}): {instead}")
    return out


def main() -> int:
    """Print what is built; a warning per missing or stale extension (exit 0: optional)."""
    gaps = missing()
    for line in gaps:
        print(f"warning: {line}", file=sys.stderr)
    if gaps:
        print(f"warning: {REBUILD}", file=sys.stderr)
    else:
        print("trainyard C extensions: all built", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
