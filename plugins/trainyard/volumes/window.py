"""Training windows and drift baselines: which validated snapshots a run reads."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainyard.errors import SnapshotError
from trainyard.fsutil import (
    read_json,
)
from trainyard.volumes.manifest import read_manifest
from trainyard.volumes.paths import (
    MANIFEST,
    _check_snapshot_id,
    _instant,
    _layout,
    check_dataset_name,
    snapshot_dir,
)
from trainyard.volumes.pointers import interval_key, latest_validated, validation_state

log = logging.getLogger("trainyard.volumes")


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


def _interval_walk(
    dataset: str, volume_root: Path | None = None
) -> Iterator[tuple[dt.datetime, str, dict[str, Any], str | None]]:
    """``(start, snapshot id, record, why not usable)`` of each interval record, by start.

    ``why`` is None for an interval whose snapshot passed validation; else what keeps it
    out: its current source was refused at staging, its snapshot is gone (deleted by
    retention, a ``snapshots gc`` or by hand), or validation did not pass it. An older
    trainyard's key of an interval recorded again since is skipped.

    Raises:
        SnapshotError: If an interval record is unreadable (naming the file).
    """
    folder = _layout(volume_root).intervals(check_dataset_name(dataset))
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    names = {p.stem for p in paths}
    rows = []
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
        snap = snapshot_dir(dataset, sid, volume_root)
        why = None
        if record.get("refused"):
            why = "its source was refused at staging"
        elif not (snap / MANIFEST).is_file():
            why = f"its snapshot {sid} is gone (deleted by retention, snapshots gc or by hand)"
        elif (state := validation_state(snap))["state"] != "validated":
            why = f"its snapshot {sid} is {state['state']}"
        rows.append((start, sid, record, why))
    yield from sorted(rows, key=lambda r: r[0])


def _validated_intervals(
    dataset: str, volume_root: Path | None = None
) -> Iterator[tuple[dt.datetime, str, dict[str, Any]]]:
    """``(start, snapshot id, record)`` of each interval whose snapshot passed validation."""
    for start, sid, record, why in _interval_walk(dataset, volume_root):
        if why is None:
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
    snapshot_id: str | None,
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
        snapshot_id: The run's snapshot (just staged and validated); None: the window as
            of ``interval_start`` alone (what retention keeps for a pipeline).
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
    return window_with_gaps(dataset, window, snapshot_id, interval_start, volume_root)[0]


def window_with_gaps(
    dataset: str,
    window: Any,
    snapshot_id: str | None,
    interval_start: str | None = None,
    volume_root: Path | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """:func:`training_window` and the intervals it spans whose data is gone.

    A gap is an interval within the window's reach whose recorded snapshot no longer
    exists (another pipeline's retention, a ``snapshots gc``, a hand): the window would
    silently train on fewer days. An interval left out on purpose (its source refused,
    its snapshot rejected) is no gap.

    Returns:
        The window's entries, and ``(interval start, why)`` per gap, oldest first.
    """
    from trainyard.errors import ConfigError

    if hasattr(window, "model_dump"):
        window = window.model_dump(mode="json")
    own = window_entry(dataset, snapshot_id, volume_root) if snapshot_id else None
    if window == "newest":
        return ([own] if own else []), []
    if not isinstance(window, dict) or not (
        {"intervals"} == set(window) or {"since"} == set(window)
    ):
        raise ConfigError(
            f"training window {window!r}: must be 'newest', {{intervals: N}} or {{since: date}}"
        )
    until = _instant(interval_start) if interval_start else None
    since = dt.date.fromisoformat(str(window["since"])) if "since" in window else None
    wanted = int(window["intervals"]) if "intervals" in window else None
    picked: dict[str, dict[str, Any]] = {}
    gaps: list[tuple[str, str]] = []
    rows = [r for r in _interval_walk(dataset, volume_root) if until is None or r[0] <= until]
    for start, sid, record, why in reversed(rows):  # newest first: the last N are wanted
        if since is not None and start.date() < since:
            break
        if wanted is not None and len(picked) >= wanted and snapshot_id in (*picked, None):
            break
        if why is not None:
            if "is gone" in why and sid not in picked:
                gaps.append((str(record["start"]), why))
            continue
        if sid not in picked:
            picked[sid] = {
                **window_entry(dataset, sid, volume_root),
                "interval": [record["start"], record.get("end")],
                "_start": start,
            }
    mine = picked.pop(snapshot_id, None) if snapshot_id else None
    others = [
        {k: v for k, v in e.items() if k != "_start"}
        for e in sorted(picked.values(), key=lambda e: e["_start"])
    ]
    if wanted is not None:
        keep = wanted - 1 if own else wanted
        others = others[max(len(others) - keep, 0) :] if keep > 0 else []
        kept = [e for e in [*others, mine] if e]
        if len(others) >= keep and kept:  # a full window: gaps older than it do not matter
            first = min(_instant(e["interval"][0]) for e in kept)
            gaps = [g for g in gaps if _instant(g[0]) >= first]
    entries = [*others, *([{**own, "interval": mine["interval"]} if mine else own] if own else [])]
    return entries, sorted(gaps)


def seen_text(snapshots: Sequence[Any], rows: int | None = None) -> str:
    """What a model was trained on, in one phrase a person reads.

    ``569 rows from 5 intervals 2026-11-01..05``; ``1797 rows from snapshot 88fa...``
    when the snapshots have no interval (given by hand).

    Args:
        snapshots: Its window's entries (``snapshot_id``, ``interval``, ``rows``).
        rows: Their rows, when known better than the entries' sum.

    Returns:
        The phrase, or ``""`` when there is nothing to say.
    """
    entries = [e for e in snapshots if isinstance(e, dict)]
    if not entries:
        return ""
    if rows is None:
        counted = [e.get("rows") for e in entries]
        rows = sum(int(r) for r in counted if isinstance(r, int)) if any(counted) else None
    amount = f"{rows} rows" if rows is not None else "its rows"
    with_interval = [e for e in entries if e.get("interval")]
    days = sorted({str(e["interval"][0])[:10] for e in with_interval})
    n = len(entries)
    if not days:
        what = f"snapshot {entries[0].get('snapshot_id')}" if n == 1 else f"{n} snapshots"
        return f"{amount} from {what}"
    span = days[0]
    if len(days) > 1:
        last = days[-1]
        span += ".." + (last[8:] if last[:8] == days[0][:8] else last)
    if len(with_interval) < n:
        return f"{amount} from {n} snapshots (intervals {span})"
    unit = "interval" if n == 1 else "intervals"
    return f"{amount} from {n} {unit} {span}"


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
