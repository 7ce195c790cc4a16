"""Names and folders of a dataset volume: datasets, snapshots, the staging area."""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainyard.errors import SnapshotError, TrainyardError
from trainyard.layout import Layout
from trainyard.settings import get_settings

log = logging.getLogger("trainyard.volumes")


HASH_ALGO = "blake3"
MANIFEST = "manifest.json"
DAMAGED = "damaged.json"
"""A reader's record, next to the shards, that it found the snapshot damaged
(:func:`mark_damaged`): staging its interval then reads the source again."""
DATASET_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
SNAPSHOT_RE = re.compile(r"^[0-9a-f]{16}$")
_HASH_CHUNK = 8 << 20


def check_dataset_name(dataset: str, error: type[TrainyardError] = SnapshotError) -> str:
    """Reject dataset names that are not plain lowercase identifiers (e.g. ``../x``).

    Args:
        dataset: The dataset name.
        error: The exception class to raise.

    Returns:
        The name, unchanged.

    Raises:
        TrainyardError: ``error`` if the name could escape the volume root.
    """
    if not isinstance(dataset, str) or not DATASET_RE.match(dataset):
        raise error(
            f"invalid dataset name {dataset!r}: must match {DATASET_RE.pattern} "
            "(no path separators or '..')"
        )
    return dataset


def _check_snapshot_id(snapshot_id: str) -> str:
    if not isinstance(snapshot_id, str) or not SNAPSHOT_RE.match(snapshot_id):
        raise SnapshotError(f"invalid snapshot id {snapshot_id!r}: expected 16 hex digits")
    return snapshot_id


def dataset_dir(dataset: str, volume_root: Path | None = None) -> Path:
    """The volume directory of one dataset.

    Args:
        dataset: The dataset name.
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        ``<volume_root>/<dataset>``.
    """
    return _layout(volume_root).dataset(check_dataset_name(dataset))


def snapshot_dir(dataset: str, snapshot_id: str, volume_root: Path | None = None) -> Path:
    """The directory of one snapshot (it may not exist).

    Args:
        dataset: The dataset name.
        snapshot_id: The content-derived snapshot id.
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        ``<volume_root>/<dataset>/snapshots/<snapshot_id>``.
    """
    return _layout(volume_root).snapshot(
        check_dataset_name(dataset), _check_snapshot_id(snapshot_id)
    )


def _layout(volume_root: Path | None) -> Layout[Path]:
    return Layout(volume_root if volume_root is not None else get_settings().volume_root)


def tmp_root(dataset: str, volume_root: Path | None = None) -> Path:
    """The private in-progress area of a dataset volume (``<dataset>/.tmp``)."""
    return _layout(volume_root).tmp(check_dataset_name(dataset))


def _instant(value: str) -> dt.datetime:
    """An ISO date or datetime as an aware datetime (naive ones read as UTC)."""
    at = dt.datetime.fromisoformat(str(value).replace(" ", "T"))
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
