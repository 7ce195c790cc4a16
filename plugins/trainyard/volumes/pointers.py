"""What a dataset's records point at.

The last validated snapshot, each interval's snapshot (and what it replaced or refused),
and a snapshot's validation state.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainyard.errors import SnapshotError
from trainyard.fsutil import (
    atomic_write_json,
    fsync_dir,
    read_json,
)
from trainyard.volumes.paths import (
    MANIFEST,
    SNAPSHOT_RE,
    _instant,
    _layout,
    _locked,
    _now,
    check_dataset_name,
    dataset_dir,
    snapshot_dir,
)

log = logging.getLogger("trainyard.volumes")


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
