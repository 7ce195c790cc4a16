"""Atomic file-system primitives shared by every stage.

Readers only ever see complete files and directories: writers fill a private temporary
path on the same file system, fsync it, then rename it into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename inside it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Fsync every file and directory below ``root`` (before publishing it)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; readers may run as another user (a serving pod).
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    )


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))


@contextmanager
def private_tmp_dir(parent: Path, prefix: str = "w-") -> Iterator[Path]:
    """A fresh directory under ``parent`` that is removed on exit unless it was published."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)


def publish_dir(tmp: Path, final: Path) -> bool:
    """Fsync ``tmp`` and rename it to ``final`` (same file system).

    Args:
        tmp: A complete directory, private to this writer.
        final: Where readers expect it.

    Returns:
        True if this call published ``final``; False if another writer already had (then
        ``tmp`` is removed and the existing directory is left untouched).
    """
    fsync_tree(tmp)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if final.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        raise
    fsync_dir(final.parent)
    return True


def load_yaml(text: str) -> Any:
    """Parse YAML safely (no object construction), with libyaml's C parser when present.

    The C parser is ~10x faster, which keeps DAG parsing of pipeline configs cheap.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)
