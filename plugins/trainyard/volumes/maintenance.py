"""Retention: what is protected, leases readers hold, and garbage collection."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainyard.errors import SnapshotError
from trainyard.fsutil import (
    HOST,
    atomic_write_json,
    fsync_dir,
    pid_alive,
    read_json,
)
from trainyard.settings import get_settings
from trainyard.volumes.manifest import list_snapshots
from trainyard.volumes.paths import (
    MANIFEST,
    _layout,
    _locked,
    _now,
    check_dataset_name,
    dataset_dir,
    snapshot_dir,
    tmp_root,
)
from trainyard.volumes.pointers import latest_validated

log = logging.getLogger("trainyard.volumes")


def protected_snapshots(dataset: str, volume_root: Path | None = None) -> dict[str, str]:
    """Snapshots that retention must keep, with the reason.

    The latest validated snapshot; every snapshot a registered model version was trained
    on (read from ``_models/*/versions/*/metadata.json``, fields ``dataset``,
    ``snapshot_id`` and every entry of ``snapshots``, its training window); and every
    snapshot the training window of ANY pipeline on this dataset covers now, whichever
    pipeline staged it (one pipeline's retention deleted days another's window still read).

    Returns:
        ``{snapshot_id: reason}``.

    Raises:
        SnapshotError: If a model's metadata or a pipeline config does not read (either
            might name any snapshot: nothing may be deleted then).
    """
    from trainyard.config import parse_pipeline, pipeline_files
    from trainyard.errors import ConfigError
    from trainyard.volumes.window import training_window

    root = volume_root if volume_root is not None else get_settings().volume_root
    keep: dict[str, str] = {}
    validated = latest_validated(dataset, root)
    if validated:
        keep[validated] = "latest validated"
    for path in pipeline_files():
        try:
            cfg = parse_pipeline(path)
        except ConfigError as e:
            raise SnapshotError(
                f"{path}: a pipeline config that does not load might read {dataset!r}: "
                f"refusing to garbage-collect ({str(e).splitlines()[-1].strip()})"
            ) from None
        if cfg.dataset != dataset or cfg.training.window == "newest":
            continue
        for entry in training_window(dataset, cfg.training.window, None, None, root):
            keep.setdefault(entry["snapshot_id"], f"training window of pipeline {cfg.name}")
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
