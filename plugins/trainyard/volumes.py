"""Dataset volumes: layout, immutable snapshots, manifests, verify, mirror and retention.

Layout (one volume per dataset; locally a directory under the volume root)::

    <volume_root>/<dataset>/snapshots/<snapshot_id>/   manifest.json + shards
    <volume_root>/<dataset>/intervals/<interval_key>.json
    <volume_root>/<dataset>/validated.json
    <volume_root>/<dataset>/.tmp/                      private in-progress writes

A snapshot directory is only ever created by renaming a complete, fsynced directory from
``.tmp/`` into ``snapshots/``, so readers never see a partial snapshot. Its id derives from
its content (the shard hashes and the contract version).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import logging
import mmap
import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import blake3

from trainyard import argtypes
from trainyard.errors import SnapshotError, TrainyardError
from trainyard.fsutil import (
    HOST,
    atomic_write_json,
    fsync_dir,
    pid_alive,
    private_tmp_dir,
    publish_dir,
    read_json,
    redact_url,
    remove_stale_tmp_dirs,
)
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


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def latest_validated(dataset: str, volume_root: Path | None = None) -> str | None:
    """The id of the snapshot of a dataset validated last that still passes, or None.

    A snapshot validated again since and rejected (its contract tightened) no longer
    counts, nor does one removed: the one validated before it does.
    """
    path = _layout(volume_root).validated(check_dataset_name(dataset))
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{path}: not valid JSON: {e}") from e
    history = [h.get("snapshot_id") for h in data.get("history") or [] if isinstance(h, dict)]
    for sid in dict.fromkeys(reversed([*history, data.get("snapshot_id")])):
        if not isinstance(sid, str) or not SNAPSHOT_RE.match(sid):
            continue
        snap = snapshot_dir(dataset, sid, volume_root)
        if (snap / MANIFEST).is_file() and validation_state(snap)["state"] != "rejected":
            return sid
    return None


def mark_validated(
    dataset: str, snapshot_id: str, summary: dict[str, Any], volume_root: Path | None = None
) -> None:
    """Record that a snapshot passed validation (it becomes the latest validated one).

    Args:
        dataset: The dataset name.
        snapshot_id: The validated snapshot.
        summary: A small JSON-able summary of the validation run.
        volume_root: Another volume root (defaults to the configured one).

    Raises:
        SnapshotError: If the snapshot does not exist.
    """
    snap = snapshot_dir(dataset, snapshot_id, volume_root)
    if not (snap / MANIFEST).is_file():
        raise SnapshotError(f"{snap}: cannot mark as validated, no such snapshot")
    folder = dataset_dir(dataset, volume_root)
    path = _layout(volume_root).validated(dataset)
    with _locked(folder / ".validated.lock"):
        try:
            history = list(read_json(path).get("history", []))
        except (FileNotFoundError, json.JSONDecodeError):
            history = []
        history.append({"snapshot_id": snapshot_id, "at": _now(), "summary": summary})
        atomic_write_json(path, {"snapshot_id": snapshot_id, "history": history})


def interval_key(start: str | None, end: str | None) -> str | None:
    """A file-name-safe key for a data interval (None when there is no interval).

    Args:
        start: Interval start (ISO date or datetime).
        end: Interval end.

    Returns:
        E.g. ``2026-11-01T000000+0000__2026-11-02T000000+0000``: an ISO date or date-time
        as its instant in UTC, so a date and the date-time of its midnight (a step run by
        hand, and Airflow's run of the same day) name one interval, not two whose
        snapshots a training window would both take.
    """
    if not start and not end:
        return None

    def clean(value: str | None) -> str:
        try:
            at = _instant(value or "").astimezone(dt.UTC)
        except ValueError:
            text = (value or "open").replace(" ", "T").replace(".", "_")
            return re.sub(r"[^0-9A-Za-z+_-]", "", text)
        micro = f"_{at.microsecond:06d}" if at.microsecond else ""
        return f"{at:%Y-%m-%dT%H%M%S}{micro}+0000"

    return f"{clean(start)}__{clean(end)}"


CANONICAL_KEY = re.compile(r"^(\d{4}-\d\d-\d\dT\d{6}(_\d{6})?\+0000|open)__")
"""How :func:`interval_key` starts a key; an older trainyard's keys (days) did not."""


def read_interval(dataset: str, key: str, volume_root: Path | None = None) -> dict | None:
    """The record of the snapshot an interval produced, or None if not staged yet.

    A record an older trainyard keyed otherwise (``2026-11-20__2026-11-21`` for a day
    staged by hand) is renamed to ``key`` first, so the interval keeps one record.
    """
    path = _layout(volume_root).interval(check_dataset_name(dataset), key)
    for _ in range(2):
        try:
            return read_json(path)
        except FileNotFoundError:
            if not _adopt_legacy_record(path):
                return None
        except json.JSONDecodeError as e:
            raise SnapshotError(f"{path}: not valid JSON: {e}") from e
    return None


def _canonical_key(path: Path) -> str | None:
    """The key :func:`interval_key` makes for the interval a record file holds, if any."""
    try:
        record = read_json(path)
        return interval_key(record.get("start"), record.get("end"))
    except (OSError, ValueError, AttributeError):
        return None


def _adopt_legacy_record(path: Path) -> bool:
    """Link an older-keyed record of ``path``'s interval to ``path``; whether one was."""
    folder = path.parent
    legacy = [
        other
        for other in (sorted(folder.glob("*.json")) if folder.is_dir() else [])
        if not CANONICAL_KEY.match(other.stem) and _canonical_key(other) == path.stem
    ]
    if not legacy:
        return False
    newest = max(legacy, key=lambda p: p.stat().st_mtime_ns)
    try:
        os.link(newest, path)
    except FileExistsError:
        return True  # another process adopted it first
    fsync_dir(folder)
    log.info("interval record %s renamed %s (one key per interval)", newest.name, path.name)
    for other in legacy:
        other.unlink(missing_ok=True)
    return True


def record_interval(
    dataset: str,
    key: str,
    record: dict[str, Any],
    *,
    overwrite: bool = False,
    volume_root: Path | None = None,
) -> dict[str, Any]:
    """Map an interval to its snapshot, without overwriting an existing mapping.

    The record is written to a temporary file and hard-linked into place, so when two runs
    record the same interval at once exactly one wins and both read the winner's record.

    Args:
        dataset: The dataset name.
        key: From :func:`interval_key`.
        record: At least ``{"snapshot_id": ...}``.
        overwrite: Replace an existing mapping (an explicit re-stage).
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        The record now on disk (ours, or the one that was already there).
    """
    path = _layout(volume_root).interval(check_dataset_name(dataset), key)
    if overwrite:
        atomic_write_json(path, record)
        return record
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    atomic_write_json(tmp, record)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return read_json(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return record


def replace_interval(
    dataset: str,
    key: str,
    record: dict[str, Any],
    *,
    why: str,
    volume_root: Path | None = None,
) -> dict[str, Any]:
    """Point an interval at a corrected snapshot, keeping what it pointed at before.

    Used when the interval's source changed (or its snapshot was rejected) and re-staging
    produced other content: the record's ``replaced`` list keeps every earlier snapshot
    with when and why it was replaced. Written atomically under the interval's lock.

    Args:
        dataset: The dataset name.
        key: From :func:`interval_key`.
        record: The new record (at least ``{"snapshot_id": ...}``).
        why: One sentence: why the interval moved (recorded).
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        The record now on disk.
    """
    path = _layout(volume_root).interval(check_dataset_name(dataset), key)
    folder = path.parent
    with _locked(folder / f".{key}.lock"):
        try:
            old = read_json(path)
        except FileNotFoundError:
            old = None
        except json.JSONDecodeError as e:
            raise SnapshotError(f"{path}: not valid JSON: {e}") from e
        replaced = list((old or {}).get("replaced", []))
        if old and old.get("snapshot_id") and old["snapshot_id"] != record["snapshot_id"]:
            replaced.append(
                {"snapshot_id": old["snapshot_id"], "staged_at": old.get("staged_at"),
                 "replaced_at": _now(), "why": why}
            )  # fmt: skip
        out = {**record, "replaced": replaced}
        atomic_write_json(path, out)
    return out


def refuse_interval(
    dataset: str, key: str, reason: str, *, volume_root: Path | None = None
) -> dict[str, Any] | None:
    """Record that an interval's current source breaks its contract at staging.

    The record keeps the snapshot it pointed at, with ``refused: {at, reason}``: that
    snapshot no longer stands for the interval (training windows and drift baselines
    leave the interval out, staging does not reuse it, ``snapshots list`` says why) until
    a staging of the interval succeeds (:func:`replace_interval` writes a record without
    it). Written atomically under the interval's lock.

    Args:
        dataset: The dataset name.
        key: From :func:`interval_key`.
        reason: The staging error (credentials masked).
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        The record now on disk, or None when the interval was never staged (nothing
        stood for it).
    """
    path = _layout(volume_root).interval(check_dataset_name(dataset), key)
    with _locked(path.parent / f".{key}.lock"):
        old = read_interval(dataset, key, volume_root)
        if not old:
            return None
        out = {**old, "refused": {"at": _now(), "reason": reason}}
        atomic_write_json(path, out)
    return out


def _interval_records(dataset: str, volume_root: Path | None) -> Iterator[dict]:
    """Every readable interval record of the dataset, in key order."""
    folder = _layout(volume_root).intervals(check_dataset_name(dataset))
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            yield record


def refused_intervals(dataset: str, volume_root: Path | None = None) -> dict[str, list[dict]]:
    """The interval records whose source was refused, by the snapshot they point at."""
    out: dict[str, list[dict]] = {}
    for record in _interval_records(dataset, volume_root):
        if record.get("refused"):
            out.setdefault(str(record.get("snapshot_id")), []).append(record)
    return out


def replaced_snapshots(dataset: str, volume_root: Path | None = None) -> dict[str, dict]:
    """Snapshots an interval no longer points at: old id → the replacement's record.

    Returns:
        ``{"by": the snapshot the interval points at now, "at": when, "why": why}`` per
        replaced snapshot (one the interval points at again is not replaced).
    """
    out: dict[str, dict] = {}
    current = set()
    for record in _interval_records(dataset, volume_root):
        now = str(record.get("snapshot_id"))
        current.add(now)
        for old in record.get("replaced") or []:
            if isinstance(old, dict) and old.get("snapshot_id") and old["snapshot_id"] != now:
                out[str(old["snapshot_id"])] = {
                    "by": now,
                    "at": old.get("replaced_at"),
                    "why": old.get("why"),
                }
    return {sid: r for sid, r in out.items() if sid not in current}


def validation_state(snapshot: Path) -> dict[str, Any]:
    """What validation said about a snapshot, from its report (``<snapshot>/validation``).

    Args:
        snapshot: The snapshot directory.

    Returns:
        ``{"state": "validated" | "rejected" | "not validated", "reason": str | None,
        "at": str | None, "report": str | None}``; ``reason`` names the broken rules of a
        rejected snapshot (at most three, then how many more).
    """
    folder = Path(snapshot) / "validation"
    rejected, summary = folder / "rejected.json", folder / "summary.json"
    try:
        if rejected.is_file():
            data = read_json(rejected)
            failures = [f for f in data.get("failures") or [] if isinstance(f, dict)]
            parts = [
                " ".join(str(x) for x in (f.get("rule"), f.get("column")) if x)
                + f": {f.get('reason')}"
                for f in failures[:3]
            ]
            more = f" and {len(failures) - 3} more" if len(failures) > 3 else ""
            reason = "; ".join(parts) + more if parts else str(data.get("reason") or "rejected")
            return {"state": "rejected", "reason": reason, "at": data.get("validated_at"),
                    "report": str(rejected)}  # fmt: skip
        if summary.is_file():
            data = read_json(summary)
            if data.get("success"):
                return {"state": "validated", "reason": None, "at": data.get("validated_at"),
                        "report": str(summary)}  # fmt: skip
    except (OSError, ValueError, AttributeError) as e:
        return {"state": "not validated", "reason": f"unreadable report: {e}", "at": None,
                "report": None}  # fmt: skip
    return {"state": "not validated", "reason": None, "at": None, "report": None}


def _instant(value: str) -> dt.datetime:
    """An ISO date or datetime as an aware datetime (naive ones read as UTC)."""
    at = dt.datetime.fromisoformat(str(value).replace(" ", "T"))
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def window_entry(dataset: str, snapshot_id: str, volume_root: Path | None = None) -> dict[str, Any]:
    """One snapshot of a training window: ``dataset``, ``snapshot_id``, ``interval``, ``rows``.

    Raises:
        SnapshotError: If the snapshot does not exist.
    """
    manifest = read_manifest(snapshot_dir(dataset, snapshot_id, volume_root))
    iv = manifest.interval
    return {
        "dataset": dataset,
        "snapshot_id": snapshot_id,
        "interval": [iv.get("start"), iv.get("end")] if iv else None,
        "rows": manifest.rows,
    }


def _validated_intervals(
    dataset: str, volume_root: Path | None = None
) -> Iterator[tuple[dt.datetime, str, dict[str, Any]]]:
    """``(start, snapshot id, record)`` of each interval whose snapshot passed validation.

    Records without a start, those whose snapshot is gone, and those whose current
    source was refused at staging (:func:`refuse_interval`) are skipped.

    Raises:
        SnapshotError: If an interval record is unreadable (naming the file).
    """
    folder = _layout(volume_root).intervals(check_dataset_name(dataset))
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    names = {p.stem for p in paths}
    for path in paths:
        try:
            record = read_json(path)
            if not record.get("start"):
                continue
            key = interval_key(record["start"], record.get("end"))
            if key != path.stem and key in names:
                continue  # an older trainyard's key of an interval recorded again since
            start = _instant(record["start"])
            sid = _check_snapshot_id(str(record["snapshot_id"]))
        except (OSError, ValueError, KeyError, TypeError, SnapshotError) as e:
            raise SnapshotError(f"{path}: unreadable interval record: {e}") from e
        if record.get("refused"):
            continue
        snap = snapshot_dir(dataset, sid, volume_root)
        if (snap / MANIFEST).is_file() and validation_state(snap)["state"] == "validated":
            yield start, sid, record


def drift_baseline(
    dataset: str,
    snapshot_id: str,
    interval_start: str | None = None,
    volume_root: Path | None = None,
) -> str | None:
    """The snapshot a snapshot's drift is measured against, or None (nothing to compare).

    For a run's data interval: the validated snapshot of the latest interval that starts
    before it, so a day's verdict does not depend on which days ran before it (a backfill
    run again, or a correction of an old day, compares each day with the day before, not
    with the newest day). Without an interval (a snapshot given by hand): the dataset's
    most recently validated snapshot. Never the snapshot itself.

    Raises:
        SnapshotError: If an interval record is unreadable.
    """
    if not interval_start:
        latest = latest_validated(dataset, volume_root)
        return latest if latest != snapshot_id else None
    until = _instant(interval_start)
    best: tuple[dt.datetime, str] | None = None
    for start, sid, _ in _validated_intervals(dataset, volume_root):
        if start < until and sid != snapshot_id and (best is None or start > best[0]):
            best = (start, sid)
    return best[1] if best else None


def training_window(
    dataset: str,
    window: Any,
    snapshot_id: str,
    interval_start: str | None = None,
    volume_root: Path | None = None,
) -> list[dict[str, Any]]:
    """The snapshots a run trains on, oldest interval first; the run's own snapshot last.

    ``newest`` is the run's snapshot alone. ``{intervals: N}`` and ``{since: date}`` read
    the dataset's interval records: an interval counts when it starts no later than the
    run's interval (``interval_start``; no bound without one) and its current snapshot
    exists and passed validation (a rejected or unvalidated one is left out, and so is
    an interval whose current source was refused at staging);
    ``{intervals: N}`` keeps the last N of them, ``{since: D}`` those starting on or after
    D. Intervals that produced the same content (one snapshot) count once, at their latest
    interval. The run's own snapshot is always in the window.

    Args:
        dataset: The dataset name.
        window: ``"newest"``, or an object with ``intervals`` or ``since``
            (``config.TrainingWindow``), or its JSON form.
        snapshot_id: The run's snapshot (just staged and validated).
        interval_start: The run's data interval start (the window ends there).
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        One :func:`window_entry` per snapshot (``interval`` is the interval it was
        recorded for, ``[start, end]``, or None).

    Raises:
        SnapshotError: If the run's snapshot does not exist or an interval record is
            unreadable (naming the file).
        ConfigError: If ``window`` is none of the three forms.
    """
    from trainyard.errors import ConfigError

    if hasattr(window, "model_dump"):
        window = window.model_dump(mode="json")
    own = window_entry(dataset, snapshot_id, volume_root)
    if window == "newest":
        return [own]
    if not isinstance(window, dict) or not (
        {"intervals"} == set(window) or {"since"} == set(window)
    ):
        raise ConfigError(
            f"training window {window!r}: must be 'newest', {{intervals: N}} or {{since: date}}"
        )
    until = _instant(interval_start) if interval_start else None
    picked: dict[str, dict[str, Any]] = {}
    for start, sid, record in _validated_intervals(dataset, volume_root):
        if until is not None and start > until:
            continue
        if "since" in window and start.date() < dt.date.fromisoformat(str(window["since"])):
            continue
        entry = {
            **window_entry(dataset, sid, volume_root),
            "interval": [record["start"], record.get("end")],
        }
        if sid not in picked or _instant(picked[sid]["interval"][0]) < start:
            picked[sid] = {**entry, "_start": start}
    mine = picked.pop(snapshot_id, None)
    others = [
        {k: v for k, v in e.items() if k != "_start"}
        for e in sorted(picked.values(), key=lambda e: e["_start"])
    ]
    if "intervals" in window:
        keep = int(window["intervals"]) - 1
        others = others[max(len(others) - keep, 0) :] if keep > 0 else []
    return [*others, {**own, "interval": mine["interval"]} if mine else own]


def data_until(snapshots: Sequence[dict[str, Any]]) -> str | None:
    """The newest data a model read: the latest interval start of its snapshots.

    Snapshots without an interval count by their creation time (``created_at``).

    Args:
        snapshots: Window entries (``interval``: ``[start, end]`` or None, ``created_at``).

    Returns:
        The ISO time, or None when no snapshot says.
    """
    times = []
    for snap in snapshots:
        iv = snap.get("interval") or [None]
        times.append(iv[0] or snap.get("created_at"))
    known = [t for t in times if t]
    return max(known, key=_instant) if known else None


@contextmanager
def lease_window(
    dataset: str,
    snapshot_ids: Sequence[str],
    *,
    purpose: str = "read",
    volume_root: Path | None = None,
) -> Iterator[list[Path]]:
    """:func:`lease_snapshot` for every snapshot of a training window, released together.

    Raises:
        SnapshotError: If any of them is gone (the ones already leased are released).
    """
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield [
            stack.enter_context(
                lease_snapshot(dataset, sid, purpose=purpose, volume_root=volume_root)
            )
            for sid in dict.fromkeys(snapshot_ids)
        ]


@contextmanager
def staging_area(dataset: str, purpose: str, volume_root: Path | None = None) -> Iterator[Path]:
    """A private directory in the dataset's ``.tmp/``, removed on exit unless published.

    Its name records host and pid (``<purpose>-<host>-<pid>-<uuid>``) so a later run can
    tell the residue of a dead process from the work of a live one.
    """
    with private_tmp_dir(tmp_root(dataset, volume_root), prefix=f"{purpose}-") as tmp:
        yield tmp


def clean_stale_tmp(dataset: str, volume_root: Path | None = None) -> list[str]:
    """Remove ``.tmp/`` entries left by dead processes (e.g. a staging run killed -9).

    Entries of this host are removed when their pid is dead; entries of other hosts (pods
    sharing the volume) only when older than a day.

    Returns:
        The names removed.
    """
    return remove_stale_tmp_dirs(tmp_root(dataset, volume_root))


def verify_snapshot(snapshot: Path) -> list[str]:
    """Re-hash every shard of a snapshot against its manifest.

    Args:
        snapshot: The snapshot directory.

    Returns:
        One line per problem (a shard that vanished, changed size or content, or an
        unexpected extra file); empty when the snapshot is intact.

    Raises:
        SnapshotError: If the manifest itself is missing or corrupt.
    """
    snapshot = Path(snapshot)
    manifest = read_manifest(snapshot)
    problems = []
    for shard in manifest.shards:
        path = snapshot / shard.path
        if not path.is_file():
            problems.append(f"{shard.path}: missing")
            continue
        size = path.stat().st_size
        if size != shard.bytes:
            problems.append(f"{shard.path}: size {size} != manifest {shard.bytes}")
            continue
        if hash_file(path) != shard.hash:
            problems.append(f"{shard.path}: content hash differs from manifest")
    expected = {s.path for s in manifest.shards} | {MANIFEST, DAMAGED}
    for path in sorted(snapshot.rglob("*")):
        rel = path.relative_to(snapshot).as_posix()
        if path.is_file() and rel not in expected and not rel.startswith("validation/"):
            problems.append(f"{rel}: not listed in the manifest")
    if compute_snapshot_id(manifest.kind, manifest.contract_version, manifest.shards) != (
        manifest.snapshot_id
    ):
        problems.append(f"{MANIFEST}: snapshot id does not match the listed shards")
    if problems:
        mark_damaged(snapshot, "; ".join(problems))
    return problems


def check_snapshot(snapshot: Path, *, content: bool = True) -> Manifest:
    """Fail closed unless every shard of a snapshot is exactly what its manifest lists.

    One streaming pass per shard at hashing speed (BLAKE3, memory-mapped, multithreaded):
    each shard is opened without following symbolic links, must be a regular file of the
    listed size, and must hash to the listed digest; the snapshot id must match the listed
    shards. Readers call it before they trust the data (validation, training, evaluation
    and the deploy's smoke test). A damaged snapshot is marked so (:func:`mark_damaged`),
    so the next staging of its interval reads the source again and replaces it.

    Args:
        snapshot: The snapshot directory.
        content: Hash every shard. Without it only the manifest, the id and each shard's
            type and size are checked (a ``stat`` per shard, what staging's reuse does)
            and nothing is marked.

    Returns:
        The manifest, checked.

    Raises:
        SnapshotError: ``snapshot <id> damaged: shard <name>: <what>`` for the first shard
            (in manifest order) that is missing, not a regular file, of another size or
            content; or the manifest is missing, corrupt or lists shards of another id.
    """
    snapshot = Path(snapshot)
    try:
        return _check_snapshot(snapshot, content)
    except SnapshotError as e:
        if content and snapshot.is_dir() and mark_damaged(snapshot, str(e)):
            raise SnapshotError(
                f"{e} (recorded: staging its interval again reads the source and replaces it)"
            ) from e
        raise


def mark_damaged(snapshot: Path, reason: str) -> bool:
    """Record that a reader found a published snapshot damaged (``<snapshot>/damaged.json``).

    Staging its interval then reads the source again instead of reusing the snapshot, and
    replaces the damaged copy (a source listing alone cannot tell a flipped bit). The
    record is written in the dataset's ``.tmp/`` and renamed into place, so a kill leaves
    either no record or a whole one. Best effort: a reader on a read-only mount (a
    training pod) or outside a dataset volume records nothing.

    Args:
        snapshot: A snapshot directory (``<dataset>/snapshots/<id>``).
        reason: What is wrong (the reader's error).

    Returns:
        Whether the record was written.
    """
    snapshot = Path(snapshot)
    if snapshot.parent.name != "snapshots" or not SNAPSHOT_RE.match(snapshot.name):
        return False
    record = {"reason": reason, "at": _now(), "host": HOST, "pid": os.getpid()}
    try:
        with private_tmp_dir(snapshot.parent.parent / ".tmp", prefix="mark-damaged-") as tmp:
            atomic_write_json(tmp / DAMAGED, record)
            os.replace(tmp / DAMAGED, snapshot / DAMAGED)
        fsync_dir(snapshot)
    except OSError as e:
        log.info("cannot record that snapshot %s is damaged: %s", snapshot.name, e)
        return False
    return True


def recorded_damage(snapshot: Path) -> dict[str, Any] | None:
    """What a reader recorded with :func:`mark_damaged`, or None (none recorded)."""
    path = Path(snapshot) / DAMAGED
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"reason": f"unreadable damage record {path}: {e}", "at": None}
    return data if isinstance(data, dict) else {"reason": str(data), "at": None}


def clear_damage(snapshot: Path) -> None:
    """Drop a damage record of a snapshot found intact since (staging re-read its source)."""
    path = Path(snapshot) / DAMAGED
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _check_snapshot(snapshot: Path, content: bool) -> Manifest:
    import stat

    manifest = read_manifest(snapshot)
    sid = manifest.snapshot_id
    if manifest.hash_algo != HASH_ALGO:
        raise SnapshotError(
            f"snapshot {sid} damaged: manifest hash_algo {manifest.hash_algo!r} is not "
            f"{HASH_ALGO!r}"
        )
    if SNAPSHOT_RE.match(snapshot.name) and snapshot.name != sid:
        raise SnapshotError(
            f"snapshot {snapshot.name} damaged: {MANIFEST} describes snapshot {sid}"
        )
    if compute_snapshot_id(manifest.kind, manifest.contract_version, manifest.shards) != sid:
        raise SnapshotError(f"snapshot {sid} damaged: {MANIFEST}: id does not match its shards")
    for shard in manifest.shards:
        path = snapshot / shard.path
        damaged = f"snapshot {sid} damaged: shard {shard.path}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise SnapshotError(f"{damaged}: cannot open {path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SnapshotError(f"{damaged}: {path} is not a regular file")
            if st.st_size != shard.bytes:
                raise SnapshotError(
                    f"{damaged}: {st.st_size} bytes, the manifest lists {shard.bytes}"
                )
            if not content:
                continue
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            if st.st_size:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                    h.update(mm)
            if h.hexdigest() != shard.hash:
                raise SnapshotError(
                    f"{damaged}: content hash differs from the manifest "
                    f"({HASH_ALGO} {h.hexdigest()[:16]}..., listed {shard.hash[:16]}...)"
                )
        except OSError as e:
            raise SnapshotError(f"{damaged}: cannot read {path}: {e.strerror}") from None
        finally:
            os.close(fd)
    return manifest


def _verify_remote(fs: Any, base: str, manifest: Manifest) -> list[str]:
    problems = []
    for shard in manifest.shards:
        path = f"{base}/{shard.path}"
        if not fs.exists(path):
            problems.append(f"{path}: missing")
            continue
        with fs.open(path, "rb") as fh:
            digest = _hash_stream(fh)
        if digest != shard.hash:
            problems.append(f"{path}: content hash differs from manifest")
    return problems


def mirror_snapshot(dataset: str, snapshot_id: str, target: str) -> str:
    """Copy a snapshot to a second volume root (path) or an fsspec URL, then verify the copy.

    A local target gets the same atomic publish as staging (``.tmp/`` then rename). A remote
    target (object store) receives the shards first and ``manifest.json`` last, so a
    manifest there means a complete copy.

    Args:
        dataset: The dataset name.
        snapshot_id: The snapshot to copy.
        target: A directory (another volume root), ``file://`` URL or any fsspec URL.

    Returns:
        The location of the verified copy.

    Raises:
        SnapshotError: If the source snapshot is broken or the copy does not verify.
    """
    import fsspec

    src = snapshot_dir(dataset, snapshot_id)
    problems = verify_snapshot(src)
    if problems:
        raise SnapshotError(f"{src}: will not mirror a damaged snapshot: " + "; ".join(problems))
    manifest = read_manifest(src)
    fs, root = fsspec.core.url_to_fs(target)
    if "file" in fs.protocol or "local" in fs.protocol:
        target_root = Path(root)
        final = snapshot_dir(dataset, snapshot_id, target_root)
        if not final.is_dir():
            clean_stale_tmp(dataset, target_root)
            with staging_area(dataset, "mirror", target_root) as tmp:
                for shard in [*manifest.shards, None]:
                    rel = shard.path if shard else MANIFEST
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src / rel, tmp / rel)
                publish_dir(tmp, final)
        problems = verify_snapshot(final)
        where = str(final)
    else:
        base = f"{root.rstrip('/')}/{dataset}/snapshots/{snapshot_id}"
        if not fs.exists(f"{base}/{MANIFEST}"):
            for shard in manifest.shards:
                fs.makedirs(f"{base}/{shard.path}".rsplit("/", 1)[0], exist_ok=True)
                fs.put_file(str(src / shard.path), f"{base}/{shard.path}")
            fs.put_file(str(src / MANIFEST), f"{base}/{MANIFEST}")
        with fs.open(f"{base}/{MANIFEST}", "rb") as fh:
            remote = Manifest.from_dict(json.loads(fh.read()))
        problems = _verify_remote(fs, base, remote)
        if remote.snapshot_id != snapshot_id:
            problems.append(f"{base}/{MANIFEST}: holds snapshot {remote.snapshot_id}")
        where = fs.unstrip_protocol(base)
    if problems:
        raise SnapshotError(f"mirror {where} does not verify: " + "; ".join(problems))
    return where


def protected_snapshots(dataset: str, volume_root: Path | None = None) -> dict[str, str]:
    """Snapshots that retention must keep, with the reason.

    The latest validated snapshot, and every snapshot a registered model version was trained
    on (read from ``_models/*/versions/*/metadata.json``, fields ``dataset``,
    ``snapshot_id`` and every entry of ``snapshots``, its training window).

    Returns:
        ``{snapshot_id: reason}``.
    """
    root = volume_root if volume_root is not None else get_settings().volume_root
    keep: dict[str, str] = {}
    validated = latest_validated(dataset, root)
    if validated:
        keep[validated] = "latest validated"
    for meta_path in sorted(root.glob("_models/*/versions/*/metadata.json")):
        try:
            meta = read_json(meta_path)
        except (OSError, json.JSONDecodeError) as e:
            raise SnapshotError(
                f"{meta_path}: unreadable model metadata, refusing to garbage-collect: {e}"
            ) from e
        if isinstance(meta, dict) and meta.get("dataset") == dataset and meta.get("snapshot_id"):
            rel = meta_path.parent.relative_to(root).as_posix()
            keep.setdefault(str(meta["snapshot_id"]), f"trained {rel}")
            for read in meta.get("snapshots") or []:
                if isinstance(read, dict) and read.get("snapshot_id"):
                    keep.setdefault(str(read["snapshot_id"]), f"trained {rel} (window)")
    return keep


LEASE_TTL_S = 600.0


def _gc_lock(dataset: str, volume_root: Path | None) -> Path:
    return dataset_dir(dataset, volume_root) / ".gc.lock"


def _lease_live(record: dict[str, Any], now: float) -> bool:
    """A lease holds until it expires; one of this host also ends with its process."""
    try:
        expires, pid, host = float(record["expires_at"]), int(record["pid"]), str(record["host"])
    except (KeyError, TypeError, ValueError):
        return False
    return expires > now and (host != HOST or pid_alive(pid))


def active_leases(
    dataset: str, volume_root: Path | None = None, *, prune: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """The live leases of a dataset's snapshots (readers that must not lose them).

    Args:
        dataset: The dataset name.
        volume_root: Another volume root (defaults to the configured one).
        prune: Remove lease files that are no longer live (expired, or their process of
            this host is gone); call it under the dataset's gc lock.

    Returns:
        ``{snapshot_id: [lease record, ...]}``; a record holds ``pid``, ``host``,
        ``purpose`` and ``expires_at`` (epoch seconds). An unreadable lease file counts as
        live until it is older than :data:`LEASE_TTL_S` (a writer may be renewing it).
    """
    import time

    folder = _layout(volume_root).leases(check_dataset_name(dataset))
    if not folder.is_dir():
        return {}
    now = time.time()
    out: dict[str, list[dict[str, Any]]] = {}
    for path in folder.glob("*.json"):
        sid = path.name.split("--", 1)[0]
        try:
            record = read_json(path)
            live = isinstance(record, dict) and _lease_live(record, now)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            try:
                live = now - path.stat().st_mtime < LEASE_TTL_S
            except FileNotFoundError:
                continue
            record = {"pid": None, "host": "?", "purpose": f"unreadable lease {path.name}"}
        if live:
            out.setdefault(sid, []).append(record)
        elif prune:
            path.unlink(missing_ok=True)
    return out


@contextmanager
def lease_snapshot(
    dataset: str,
    snapshot_id: str,
    *,
    purpose: str = "read",
    ttl_s: float = LEASE_TTL_S,
    volume_root: Path | None = None,
) -> Iterator[Path]:
    """Hold a snapshot against retention while reading it (``with`` block).

    Writes ``<dataset>/leases/<id>--<host>-<pid>-<uuid>.json`` (pid, host, purpose,
    expiry) under the dataset's gc lock, after checking the snapshot exists, and renews
    the expiry from a thread every ``ttl_s / 3`` seconds; the file is removed on exit.
    :func:`gc_snapshots` keeps every snapshot with a live lease: not expired, and on this
    host its process still running (a reader killed -9 frees it at once here, after
    ``ttl_s`` elsewhere).

    Args:
        dataset: The dataset name.
        snapshot_id: The snapshot to hold.
        purpose: Who holds it (recorded, shown by ``snapshots gc``), e.g. ``train <run>``.
        ttl_s: Seconds a lease outlives its last renewal.
        volume_root: Another volume root (defaults to the configured one).

    Yields:
        The snapshot directory.

    Raises:
        SnapshotError: If the snapshot does not exist (already deleted) or the lease cannot
            be written.
    """
    import threading
    import time
    import uuid

    snap = snapshot_dir(dataset, snapshot_id, volume_root)
    folder = _layout(volume_root).leases(check_dataset_name(dataset))
    path = folder / f"{snapshot_id}--{HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
    record = {
        "snapshot_id": snapshot_id,
        "pid": os.getpid(),
        "host": HOST,
        "purpose": purpose,
        "acquired_at": _now(),
    }

    def write() -> None:
        atomic_write_json(path, {**record, "expires_at": time.time() + ttl_s})

    with _locked(_gc_lock(dataset, volume_root)):
        if not (snap / MANIFEST).is_file():
            raise SnapshotError(
                f"{snap}: cannot lease snapshot {snapshot_id} for {purpose}: no such snapshot "
                "(never staged, or deleted by retention)"
            )
        try:
            write()
        except OSError as e:
            raise SnapshotError(f"{path}: cannot write the lease of {snapshot_id}: {e}") from e
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                write()
            except OSError as e:
                sys.stderr.write(f"trainyard: cannot renew lease {path}: {e}\n")

    thread = threading.Thread(target=renew, name=f"lease-{snapshot_id}", daemon=True)
    thread.start()
    try:
        yield snap
    finally:
        stop.set()
        thread.join()
        path.unlink(missing_ok=True)


def gc_snapshots(
    dataset: str,
    keep: int,
    *,
    dry_run: bool = False,
    also_keep: set[str] | frozenset[str] = frozenset(),
    volume_root: Path | None = None,
) -> list[str]:
    """Apply retention: keep the newest ``keep`` snapshots and every protected one.

    A doomed snapshot is first renamed into ``.tmp/`` (atomically leaving ``snapshots/``),
    then deleted, so a reader never sees half of a snapshot.

    Args:
        dataset: The dataset name.
        keep: How many of the newest snapshots to keep (``staging.retention``).
        dry_run: Only report what would be deleted.
        also_keep: More ids to keep (e.g. the snapshot a run just returned).
        volume_root: Another volume root (defaults to the configured one).

    Returns:
        The ids deleted (or that would be). Snapshots with a live lease
        (:func:`lease_snapshot`) are kept whatever their age.

    Raises:
        SnapshotError: If ``keep`` < 1, or a model's metadata is unreadable (it might name
            any snapshot: nothing is deleted).
    """
    if keep < 1:
        raise SnapshotError(f"retention must keep at least 1 snapshot, got {keep}")
    trash_root = tmp_root(dataset, volume_root)
    trashed: list[Path] = []
    # under the lock no reader can take a lease between the check and the rename
    with _locked(_gc_lock(dataset, volume_root)):
        snaps = list_snapshots(dataset, volume_root)
        protected = protected_snapshots(dataset, volume_root)
        leased = active_leases(dataset, volume_root, prune=not dry_run)
        recent = {m.snapshot_id for m in snaps[-keep:]}
        doomed = [
            m.snapshot_id
            for m in snaps
            if m.snapshot_id not in recent
            and m.snapshot_id not in protected
            and m.snapshot_id not in leased
            and m.snapshot_id not in also_keep
        ]
        if dry_run:
            return doomed
        trash_root.mkdir(parents=True, exist_ok=True)
        for sid in doomed:
            src = snapshot_dir(dataset, sid, volume_root)
            trash = trash_root / f"gc-{HOST}-{os.getpid()}-{sid}"
            os.rename(src, trash)
            fsync_dir(src.parent)
            trashed.append(trash)
    for trash in trashed:
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _cli_list(args: argparse.Namespace) -> int:
    datasets = [args.dataset] if args.dataset else list_datasets()
    if args.dataset and args.dataset not in list_datasets():
        from trainyard.contracts import contract_files

        contracts = [p.stem for p in contract_files()]
        if args.dataset not in contracts:
            known = sorted({*list_datasets(), *contracts})
            raise SnapshotError(
                f"unknown dataset {args.dataset!r}: no data contract and no volume "
                f"(known: {', '.join(known) or 'none'})"
            )
        print(f"{args.dataset}: no snapshots yet (stage one with its pipeline)")
        return 0
    head = f"{'dataset':<16} {'snapshot':<16} {'kind':<5} {'rows':>10} {'size':>10}"
    print(f"{head}  created / interval / validation")
    for ds in datasets:
        validated = latest_validated(ds)
        refused = refused_intervals(ds)
        replaced = replaced_snapshots(ds)
        for m in list_snapshots(ds):
            mark = " *last validated" if m.snapshot_id == validated else ""
            if (by := replaced.get(m.snapshot_id)) is not None:
                mark += f" REPLACED by {by['by']} at {by['at']} (its interval points there now)"
            for r in refused.get(m.snapshot_id, []):
                mark += (
                    f" SUPERSEDED: [{r.get('start')} .. {r.get('end')})'s source was refused "
                    f"at {r['refused'].get('at')} ({r['refused'].get('reason')}); left out "
                    "until it stages"
                )
            state = validation_state(snapshot_dir(ds, m.snapshot_id))
            if state["state"] == "rejected":
                mark += f" REJECTED: {state['reason']}"
            elif state["state"] == "not validated":
                mark += " (not validated)"
            damage = recorded_damage(snapshot_dir(ds, m.snapshot_id))
            if damage is not None:
                mark += f" DAMAGED: {damage['reason']} (staging its interval replaces it)"
            iv = f"  [{m.interval['start']} .. {m.interval['end']})" if m.interval else ""
            print(
                f"{ds:<16} {m.snapshot_id:<16} {m.kind:<5} {m.rows:>10} "
                f"{_fmt_bytes(m.bytes):>10}  {m.created_at}{iv}{mark}"
            )
    return 0


def _cli_show(args: argparse.Namespace) -> int:
    snap = snapshot_dir(args.dataset, args.snapshot_id)
    shown = read_manifest(snap).to_dict()
    if isinstance(shown["source"].get("url"), str):
        # manifests written before URLs were redacted at staging
        shown["source"]["url"] = redact_url(shown["source"]["url"])
    shown["validation"] = validation_state(snap)
    shown["damaged"] = recorded_damage(snap)
    print(json.dumps(shown, indent=2))
    return 0


def _cli_verify(args: argparse.Namespace) -> int:
    ids = args.snapshot_id or [m.snapshot_id for m in list_snapshots(args.dataset)]
    bad = 0
    for sid in ids:
        problems = verify_snapshot(snapshot_dir(args.dataset, sid))
        if problems:
            bad += 1
            for p in problems:
                print(f"{args.dataset}/{sid}: {p}")
        else:
            print(f"{args.dataset}/{sid}: ok")
    return 1 if bad else 0


def _cli_mirror(args: argparse.Namespace) -> int:
    where = mirror_snapshot(args.dataset, args.snapshot_id, args.target)
    print(f"{args.dataset}/{args.snapshot_id}: mirrored and verified at {where}")
    return 0


def _cli_gc(args: argparse.Namespace) -> int:
    keep = args.keep
    if keep is None:
        from trainyard.config import load_pipeline

        keep = load_pipeline(args.pipeline).staging.retention if args.pipeline else 7
    removed = clean_stale_tmp(args.dataset)
    doomed = gc_snapshots(args.dataset, keep, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{args.dataset}: kept newest {keep}, {verb} {len(doomed)}: {', '.join(doomed) or '-'}"
        f"; removed {len(removed)} stale temp entries"
    )
    for sid, leases in sorted(active_leases(args.dataset).items()):
        holders = ", ".join(
            f"{r.get('purpose')} (pid {r.get('pid')} on {r.get('host')})" for r in leases
        )
        print(f"{args.dataset}/{sid}: leased by {holders}")
    return 0


def cli_main(argv: list[str]) -> int:
    """``trainyard snapshots list|show|verify|mirror|gc``.

    Args:
        argv: Arguments after ``snapshots``.

    Returns:
        0 on success, 1 if ``verify`` found a damaged snapshot.
    """
    parser = argtypes.ArgumentParser(prog="trainyard snapshots")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="list snapshots (of one dataset or all)")
    p.add_argument("dataset", nargs="?")
    p.set_defaults(fn=_cli_list)
    p = sub.add_parser("show", help="print a snapshot's manifest")
    p.add_argument("dataset")
    p.add_argument("snapshot_id")
    p.set_defaults(fn=_cli_show)
    p = sub.add_parser("verify", help="re-hash shards against the manifest")
    p.add_argument("dataset")
    p.add_argument("snapshot_id", nargs="*", help="default: every snapshot of the dataset")
    p.set_defaults(fn=_cli_verify)
    p = sub.add_parser("mirror", help="copy a snapshot to another volume root or URL, verify")
    p.add_argument("dataset")
    p.add_argument("snapshot_id")
    p.add_argument("target", help="a directory (volume root) or an fsspec URL")
    p.set_defaults(fn=_cli_mirror)
    p = sub.add_parser("gc", help="apply retention and remove stale temp entries")
    p.add_argument("dataset")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--keep", type=int, help="newest snapshots to keep")
    group.add_argument("--pipeline", help="take the retention from this pipeline's config")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(fn=_cli_gc)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except BrokenPipeError:
        sys.stderr.close()
        return 0
