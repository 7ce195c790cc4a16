"""Snapshot manifests: shards, content-derived ids, hashes, and listing snapshots."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import blake3

from trainyard.errors import SnapshotError
from trainyard.fsutil import (
    read_json,
)
from trainyard.settings import get_settings
from trainyard.volumes.paths import (
    _HASH_CHUNK,
    DATASET_RE,
    MANIFEST,
    SNAPSHOT_RE,
    _layout,
    check_dataset_name,
)

log = logging.getLogger("trainyard.volumes")


@dataclass(frozen=True)
class ShardInfo:
    """One file of a snapshot.

    Attributes:
        path: Relative to the snapshot directory.
        bytes: File size.
        rows: Rows (table shards, the index) or samples (tar shards).
        hash: Hex digest of the file content (``Manifest.hash_algo``).
        role: ``"data"`` or ``"index"``.
    """

    path: str
    bytes: int
    rows: int
    hash: str
    role: Literal["data", "index"] = "data"


@dataclass(frozen=True)
class Manifest:
    """The description of one snapshot: the unit of lineage.

    Attributes:
        snapshot_id: Content-derived id (16 hex digits).
        dataset: Dataset name.
        kind: ``"table"`` (Parquet shards) or ``"files"`` (tar shards + index.parquet).
        shards: Every file of the snapshot except the manifest.
        hash_algo: ``"blake3"`` or ``"xxh3_128"``.
        schema: Arrow schema of the table view, ``[{"name", "type", "nullable"}]``.
        contract_version: Version of the data contract the data was cast to.
        source: Where the data came from (``url``, ``format``, ``files``, ``bytes``).
        interval: ``{"start", "end"}`` of the data interval, or None.
        created_at: ISO-8601 UTC time of staging.
        rows: Total rows (table) or samples (files).
        bytes: Total bytes of the data shards.
        extra: Kind-specific facts (e.g. ``classes`` of an image folder).
    """

    snapshot_id: str
    dataset: str
    kind: Literal["table", "files"]
    shards: list[ShardInfo]
    hash_algo: str
    schema: list[dict[str, Any]]
    contract_version: str
    source: dict[str, Any]
    interval: dict[str, str | None] | None
    created_at: str
    rows: int
    bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``manifest.json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Build a manifest from its JSON form.

        Raises:
            SnapshotError: If a field is missing or has the wrong shape.
        """
        try:
            shards = [ShardInfo(**s) for s in data["shards"]]
            return cls(
                snapshot_id=str(data["snapshot_id"]),
                dataset=str(data["dataset"]),
                kind=data["kind"],
                shards=shards,
                hash_algo=str(data["hash_algo"]),
                schema=list(data["schema"]),
                contract_version=str(data["contract_version"]),
                source=dict(data["source"]),
                interval=data.get("interval"),
                created_at=str(data["created_at"]),
                rows=int(data["rows"]),
                bytes=int(data["bytes"]),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SnapshotError(f"manifest is malformed: {type(e).__name__}: {e}") from e

    @property
    def data_shards(self) -> list[ShardInfo]:
        """The shards with role ``data``."""
        return [s for s in self.shards if s.role == "data"]


def compute_snapshot_id(kind: str, contract_version: str, shards: Sequence[ShardInfo]) -> str:
    """Derive a snapshot id from content: same data and contract, same id.

    Args:
        kind: ``"table"`` or ``"files"``.
        contract_version: The contract version the data was cast to.
        shards: The snapshot's shards.

    Returns:
        The first 16 hex digits of BLAKE3 over kind, contract version and shard hashes.
    """
    parts = [kind, contract_version] + [f"{s.path}:{s.rows}:{s.hash}" for s in shards]
    return blake3.blake3("\n".join(parts).encode()).hexdigest()[:16]


def hash_file(path: Path) -> str:
    """BLAKE3 hex digest of a local file (memory-mapped, multithreaded for large files)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if path.stat().st_size > 0:
        h.update_mmap(path)
    return h.hexdigest()


def _hash_stream(fh: Any) -> str:
    h = blake3.blake3()
    while chunk := fh.read(_HASH_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def read_manifest(snapshot: Path) -> Manifest:
    """Read ``manifest.json`` of a snapshot directory.

    Args:
        snapshot: The snapshot directory.

    Returns:
        The manifest.

    Raises:
        SnapshotError: If the manifest is missing, not JSON or malformed.
    """
    path = Path(snapshot) / MANIFEST
    try:
        data = read_json(path)
    except FileNotFoundError as e:
        raise SnapshotError(f"{path}: manifest not found (no such snapshot?)") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SnapshotError(f"{path}: manifest is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise SnapshotError(f"{path}: manifest must be a JSON object")
    try:
        return Manifest.from_dict(data)
    except SnapshotError as e:
        raise SnapshotError(f"{path}: {e}") from e


def table_files(snapshot: Path) -> list[Path]:
    """The Parquet files of a snapshot's table view (what validation reads).

    Args:
        snapshot: The snapshot directory.

    Returns:
        The data shards of a table snapshot, or ``index.parquet`` of a files snapshot.
    """
    manifest = read_manifest(snapshot)
    role = "data" if manifest.kind == "table" else "index"
    return [Path(snapshot) / s.path for s in manifest.shards if s.role == role]


def data_shards(snapshot: Path, kind: str | None = None) -> list[Path]:
    """The data shards a snapshot's manifest lists, in its order, each checked to be there.

    Args:
        snapshot: The snapshot directory.
        kind: The kind the reader needs (``table`` or ``files``), if it needs one.

    Raises:
        SnapshotError: A snapshot of another kind, a listed shard missing, or none listed.
    """
    manifest = read_manifest(snapshot)
    if kind is not None and manifest.kind != kind:
        raise SnapshotError(f"{snapshot}: expected a {kind} snapshot, got kind {manifest.kind!r}")
    out = [Path(snapshot) / s.path for s in manifest.data_shards]
    for path in out:
        if not path.is_file():
            raise SnapshotError(f"{path}: shard listed in the manifest is missing")
    if not out:
        raise SnapshotError(f"{Path(snapshot) / MANIFEST}: no data shards")
    return out


def list_snapshots(dataset: str, volume_root: Path | None = None) -> list[Manifest]:
    """Every complete snapshot of a dataset, oldest first.

    Args:
        dataset: The dataset name.
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        The manifests, sorted by ``created_at`` then id.
    """
    folder = _layout(volume_root).snapshots(check_dataset_name(dataset))
    if not folder.is_dir():
        return []
    out = []
    for child in folder.iterdir():
        if SNAPSHOT_RE.match(child.name) and (child / MANIFEST).is_file():
            out.append(read_manifest(child))
    return sorted(out, key=lambda m: (m.created_at, m.snapshot_id))


def list_datasets(volume_root: Path | None = None) -> list[str]:
    """Names of the dataset volumes under the volume root (``_models`` etc. excluded)."""
    root = volume_root if volume_root is not None else get_settings().volume_root
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and DATASET_RE.match(p.name))
