"""Staging: a pipeline's raw source -> an immutable, content-addressed dataset snapshot.

``stage(pipeline, interval_start, interval_end)`` reads the source through fsspec, casts
tables to the contract's schema (Parquet shards) or packs small files into WebDataset tar
shards, writes everything into a private ``.tmp/`` directory on the dataset volume, fsyncs
it and renames it into ``snapshots/<id>``. The id derives from content, so re-staging the
same data reuses the existing snapshot; a data interval maps to the snapshot it produced.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard import volumes
from trainyard.connections import conn_env_name
from trainyard.errors import (
    SnapshotError,
    SourceInvalid,
    SourceMissing,
    SourceUnreadable,
    StagingError,
    TrainyardError,
)
from trainyard.fsutil import atomic_write_json, publish_dir, redact_text, redact_url
from trainyard.progress import Progress, human_bytes
from trainyard.staging.sources import open_source, read_contract

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.connections import Connection

log = logging.getLogger(__name__)

__all__ = ["StageResult", "stage"]


@dataclass(frozen=True)
class StageResult:
    """What one staging run produced.

    Attributes:
        snapshot_id: Content-derived id.
        dataset: Dataset name.
        path: The snapshot directory.
        reused: True if the snapshot already existed (nothing new was published).
        rows: Rows (table) or samples (files).
        bytes: Bytes of the data shards.
        shards: Number of data shards.
        seconds: Wall time of the run.
        checked: One sentence: what this run actually checked or read to get the snapshot
            (the run summary prints it).
        replaced: The snapshot the interval pointed at before, when a changed source (or
            a rejected snapshot) made it point at another one.
    """

    snapshot_id: str
    dataset: str
    path: Path
    reused: bool
    rows: int
    bytes: int
    shards: int
    seconds: float
    checked: str = ""
    replaced: str | None = None

    def summary(self) -> str:
        """One line for logs: id, new/reused, rows, shards, size, time and throughput."""
        state = "reused" if self.reused else "new"
        rate = human_bytes(self.bytes / self.seconds) if self.seconds > 0 else "-"
        line = (
            f"staged {self.dataset}: snapshot {self.snapshot_id} ({state}), {self.rows} rows, "
            f"{self.shards} shards, {human_bytes(self.bytes)} in {self.seconds:.2f}s ({rate}/s)"
        )
        return f"{line}; {self.checked}" if self.checked else line


def _result(
    manifest: volumes.Manifest,
    path: Path,
    reused: bool,
    t0: float,
    checked: str = "",
    replaced: str | None = None,
) -> StageResult:
    data = manifest.data_shards
    return StageResult(
        snapshot_id=manifest.snapshot_id,
        dataset=manifest.dataset,
        path=path,
        reused=reused,
        rows=manifest.rows,
        bytes=sum(s.bytes for s in data),
        shards=len(data),
        seconds=time.monotonic() - t0,
        checked=checked,
        replaced=replaced,
    )


def _files(n: int) -> str:
    return f"{n} file{'s' if n != 1 else ''}"


def _recheck(
    dataset: str, record: dict | None, fingerprint: str, src_files: int, src_bytes: int
) -> tuple[Path | None, str]:
    """Whether an interval's recorded snapshot still stands for its source, and why (not).

    Returns:
        ``(snapshot dir, sentence)`` when the recorded snapshot can be reused without reading
        the source, else ``(None, why the source must be read)``.
    """
    if not record:
        return None, "first staging of this interval"
    sid = str(record.get("snapshot_id"))
    path = volumes.snapshot_dir(dataset, sid)
    if not (path / volumes.MANIFEST).is_file():
        return None, f"the interval's snapshot {sid} no longer exists"
    refused = record.get("refused")
    if refused:
        return None, f"the interval's source was refused at {refused.get('at')}"
    state = volumes.validation_state(path)
    if state["state"] == "rejected":
        return None, f"the interval's snapshot {sid} was rejected ({state['reason']})"
    damage = volumes.recorded_damage(path)
    if damage is not None:
        return None, f"a reader found the interval's snapshot {sid} damaged at {damage['at']}"
    try:  # a stat per shard; the hashes are the readers' check (they mark what they find)
        volumes.check_snapshot(path, content=False)
    except SnapshotError as e:
        return None, f"the interval's snapshot {sid} is damaged ({e})"
    if not record.get("source_fingerprint"):
        return None, f"no source listing was recorded with snapshot {sid}"
    if record["source_fingerprint"] != fingerprint:
        return None, (
            f"the source changed since snapshot {sid} was staged at {record.get('staged_at')} "
            "(file sizes, change stamps, or the contract's version or columns differ)"
        )
    return path, (
        f"source unchanged since {record.get('staged_at')}: {_files(src_files)}, "
        f"{human_bytes(src_bytes)}, same names, sizes and change stamps, same contract "
        "version and columns (listed, not re-read; validation applies the contract's rules "
        "again)"
    )


def _ensure_source(pipeline: PipelineConfig, url: str, ds: str | None) -> None:
    if not pipeline.source.bootstrap or ("://" in url and not url.startswith("file://")):
        return
    path = Path(url.removeprefix("file://"))
    if path.exists():
        return
    from trainyard.staging.bootstrap import run_bootstrap

    log.info("source %s is missing: bootstrapping it with %s", path, pipeline.source.bootstrap)
    run_bootstrap(pipeline.source.bootstrap, path, ds)


def _damage(snapshot: Path) -> str | None:
    """What is wrong with a published snapshot, as readers check it, or None if intact."""
    try:
        volumes.check_snapshot(snapshot)
    except SnapshotError as e:
        found = e.__cause__ if isinstance(e.__cause__, SnapshotError) else e  # not the hint
        return str(found)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def stage(
    pipeline: PipelineConfig,
    interval_start: str | None = None,
    interval_end: str | None = None,
    *,
    restage: bool = False,
    quiet: bool = False,
) -> StageResult:
    """Stage a pipeline's raw source for a data interval into a dataset snapshot.

    Args:
        pipeline: The pipeline config (dataset, source, staging options).
        interval_start: Data interval start (ISO); its date fills ``{ds}`` in the URL.
        interval_end: Data interval end (ISO).
        restage: Re-read the source even if its listing is unchanged since the interval
            was staged (the interval then points at what it holds; old snapshots stay).
        quiet: No progress line and no summary on stderr.

    An interval that was staged before is not re-read while its source lists the same
    files (names, sizes, change stamps) under the same contract terms (version,
    columns and their types, extension) and its
    snapshot was not rejected. Otherwise content decides: the source is read again, and a
    different content becomes a new snapshot the interval points at (its record keeps the
    snapshots it pointed at before, in ``replaced``). A source that is gone still maps to a
    recorded snapshot that was not rejected. ``StageResult.checked`` says which happened.

    Returns:
        The snapshot (new, or reused when the same content or interval was staged before).

    Raises:
        StagingError: For a bad dataset name, missing/empty/corrupt/changing/hostile
            source (non-regular files, links out of the folder, loops, oversized rows,
            labels or images), ill-typed rows or a failed write; nothing is published
            then. Credentials in the source URL are masked in every message.
    """
    from trainyard.connections import read_connection

    conn_id = pipeline.source.conn_id
    conn = read_connection(conn_id) if conn_id else None
    if conn_id and conn is None:
        raise SourceUnreadable(
            f"the Airflow connection {conn_id!r} (source.conn_id) is not available to this "
            f"step: no {conn_env_name(conn_id)} in its environment (the local runner passes "
            "it from Airflow; on a cluster give the pod a Secret with it, or use workload "
            "identity and drop conn_id)"
        )
    secrets = conn.secrets if conn is not None else ()
    try:
        return _stage(
            pipeline, interval_start, interval_end, conn=conn, restage=restage, quiet=quiet
        )
    except TrainyardError as e:
        clean = redact_text(str(e), secrets)
        if isinstance(e, SourceInvalid):
            _refuse(pipeline.dataset, interval_start, interval_end, clean)
        if clean == str(e):
            raise
        error: TrainyardError = type(e)(clean)
    except FileNotFoundError as e:
        error = SourceMissing(f"{redact_url(pipeline.source.url)}: {redact_text(str(e), secrets)}")
    except PermissionError as e:
        error = _unreadable(pipeline, e, secrets)
    except OSError as e:  # a connection lost or timed out: a retry may read it
        error = StagingError(_library_message(pipeline, e, secrets))
    except Exception as e:
        if type(e).__module__.split(".")[0] not in STORAGE_LIBRARIES:
            clean = redact_text(str(e), secrets)
            if clean == str(e):
                raise  # a fault of trainyard's own: its traceback matters
            error = StagingError(f"{type(e).__name__}: {clean}")
        else:  # a storage library's refusal (botocore's ParamValidationError, ...)
            error = _unreadable(pipeline, e, secrets)
    # raised outside the handler, so the unredacted error is not even its context
    raise error


STORAGE_LIBRARIES = frozenset(
    {"fsspec", "s3fs", "botocore", "aiobotocore", "boto3", "gcsfs", "google", "adlfs", "azure"}
    | {"aiohttp", "requests", "urllib3"}
)
"""Packages whose exceptions mean the source could not be read, not a fault of trainyard's."""


def _library_message(pipeline: PipelineConfig, e: BaseException, secrets: Any) -> str:
    return (
        f"{redact_url(pipeline.source.url)}: reading the source failed: "
        f"{type(e).__name__}: {redact_text(str(e), secrets)}"
    )


def _unreadable(pipeline: PipelineConfig, e: BaseException, secrets: Any) -> SourceUnreadable:
    """A storage library's refusal (credentials, a bad name, a denied request): not retried."""
    return SourceUnreadable(
        _library_message(pipeline, e, secrets)
        + " (check source.url and the credentials of source.conn_id; a retry would fail alike)"
    )


def _refuse(dataset: str, start: str | None, end: str | None, reason: str) -> None:
    """Record in the interval's record that its current source was refused.

    Its earlier snapshot then no longer stands for it (training windows and drift
    baselines leave the interval out) until a staging of it succeeds.
    """
    key = volumes.interval_key(start, end)
    if key is None:
        return
    try:
        volumes.refuse_interval(dataset, key, reason)
    except (OSError, TrainyardError) as e:
        log.warning("cannot record that interval %s was refused: %s", key, e)


def _stage(
    pipeline: PipelineConfig,
    interval_start: str | None,
    interval_end: str | None,
    *,
    conn: Connection | None,
    restage: bool,
    quiet: bool,
) -> StageResult:
    t0 = time.monotonic()
    dataset = volumes.check_dataset_name(pipeline.dataset, StagingError)
    volumes.clean_stale_tmp(dataset)
    key = volumes.interval_key(interval_start, interval_end)
    record = volumes.read_interval(dataset, key) if key else None
    contract = read_contract(dataset)
    ds = interval_start[:10] if interval_start else None
    if "{ds}" in pipeline.source.url and not ds:
        raise StagingError(
            f"{redact_url(pipeline.source.url)}: the source is partitioned by {{ds}}, so "
            "staging needs a data interval (interval_start)"
        )
    url = pipeline.source_url(ds)
    _ensure_source(pipeline, url, ds)
    try:
        src = open_source(url, pipeline.source.format, contract.extension, conn)
    except StagingError as e:
        kept = None if restage else _kept_without_source(dataset, record, e, t0)
        if kept is None:
            raise
        _report(kept, quiet)
        return kept
    fingerprint = src.fingerprint(contract.staging_terms)
    kept_path, why = (
        (None, "a re-stage was asked for")
        if restage
        else _recheck(dataset, record, fingerprint, src.count, src.total_bytes)
    )
    if kept_path is not None:
        result = _result(volumes.read_manifest(kept_path), kept_path, True, t0, checked=why)
        _report(result, quiet)
        return result
    progress = Progress(f"staging {dataset}", src.total_bytes, items="files", items_total=src.count)
    advance = (lambda n, files=0: None) if quiet else progress.advance
    with volumes.staging_area(dataset, "stage") as tmp:
        if src.format == "image_folder":
            from trainyard.staging.files import stage_files

            shards, schema, extra = stage_files(
                src, tmp, shard_target_mb=pipeline.staging.shard_target_mb, advance=advance
            )
            kind = "files"
        else:
            from trainyard.staging.tables import stage_table

            shards, schema = stage_table(
                src,
                contract,
                tmp,
                shard_target_mb=pipeline.staging.shard_target_mb,
                row_group_rows=pipeline.staging.row_group_rows,
                advance=advance,
            )
            kind, extra = "table", {}
        progress.close()
        # the small-files stager compares every file with its listing as it reads it
        src.check_unchanged(files_verified=kind == "files" and src.is_local)
        from trainyard.staging.tables import schema_to_json

        data = [s for s in shards if s.role == "data"]
        snapshot_id = volumes.compute_snapshot_id(kind, contract.version, shards)
        manifest = volumes.Manifest(
            snapshot_id=snapshot_id,
            dataset=dataset,
            kind=kind,
            shards=shards,
            hash_algo=volumes.HASH_ALGO,
            schema=schema_to_json(schema),
            contract_version=contract.version,
            source=src.describe(),
            interval=({"start": interval_start, "end": interval_end} if key is not None else None),
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
            rows=sum(s.rows for s in data),
            bytes=sum(s.bytes for s in data),
            extra=extra,
        )
        final = volumes.snapshot_dir(dataset, snapshot_id)
        reused = final.is_dir()
        repaired = _damage(final) if reused else None
        if reused and repaired is None:
            volumes.clear_damage(final)  # found intact: a stale record must not cost re-reads
        with contextlib.ExitStack() as aside:
            if repaired is not None:  # the source's bytes are in hand: they replace the copy
                log.warning("snapshot %s is damaged (%s): staged again", snapshot_id, repaired)
                damaged = aside.enter_context(volumes.staging_area(dataset, "damaged"))
                with contextlib.suppress(FileNotFoundError):  # another stager moved it
                    os.rename(final, damaged / snapshot_id)
                reused = False
            if not reused:
                try:
                    atomic_write_json(tmp / volumes.MANIFEST, manifest.to_dict())
                    reused = not publish_dir(tmp, final)
                except OSError as e:
                    raise StagingError(f"{tmp}: cannot publish snapshot {snapshot_id}: {e}") from e
    if reused:
        manifest = volumes.read_manifest(final)
    read = f"read {_files(src.count)} ({human_bytes(src.total_bytes)}) because {why}"
    checked = f"{read}: same content as snapshot {snapshot_id}" if reused else f"{read}: new"
    if repaired is not None:
        checked = (
            f"{read}: same content as snapshot {snapshot_id}, whose damaged copy it replaced "
            f"({repaired}; validate it again)"
        )
    replaced = None
    if key is not None:
        new_record = {
            "snapshot_id": snapshot_id,
            "start": interval_start,
            "end": interval_end,
            "staged_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "source_fingerprint": fingerprint,
        }
        if record is None:
            kept = volumes.record_interval(dataset, key, new_record)
            if kept["snapshot_id"] != snapshot_id:
                log.warning(
                    "interval %s was mapped to snapshot %s by a concurrent run; staged %s is "
                    "kept but not mapped",
                    key,
                    kept["snapshot_id"],
                    snapshot_id,
                )
        else:
            before = record.get("snapshot_id") if record else None
            volumes.replace_interval(dataset, key, new_record, why=why)
            if before and before != snapshot_id:
                replaced = str(before)
                checked += f"; the interval now points at it instead of {before}"
    try:
        keep = {snapshot_id} | _window_snapshots(pipeline, snapshot_id, interval_start)
        volumes.gc_snapshots(dataset, pipeline.staging.retention, also_keep=keep)
    except (SnapshotError, OSError) as e:
        # the snapshot is published; retention that cannot decide deletes nothing
        log.warning("retention of %s skipped, nothing deleted: %s", dataset, e)
    result = _result(manifest, final, reused, t0, checked=checked, replaced=replaced)
    _report(result, quiet)
    return result


def _window_snapshots(
    pipeline: PipelineConfig, snapshot_id: str, interval_start: str | None
) -> set[str]:
    """The snapshots the pipeline's training window holds as of this interval.

    Retention keeps them even beyond ``staging.retention`` (a backfill of more days than
    that must still train on all of them).
    """
    if pipeline.training.window == "newest":
        return set()
    entries = volumes.training_window(
        pipeline.dataset, pipeline.training.window, snapshot_id, interval_start
    )
    return {e["snapshot_id"] for e in entries}


def _kept_without_source(
    dataset: str, record: dict | None, error: StagingError, t0: float
) -> StageResult | None:
    """The interval's recorded snapshot when its source is gone (an upstream cleanup).

    A snapshot that passed or awaits validation still stands for its interval; a rejected
    one, or one whose interval's source was refused since, does not (the source error is
    raised instead).
    """
    if not record or record.get("refused"):
        return None
    sid = str(record.get("snapshot_id"))
    path = volumes.snapshot_dir(dataset, sid)
    if not (path / volumes.MANIFEST).is_file():
        return None
    if volumes.validation_state(path)["state"] == "rejected":
        return None
    why = f"source not readable now ({error}); reused snapshot {sid} recorded for the interval"
    return _result(volumes.read_manifest(path), path, True, t0, checked=why)


def _report(result: StageResult, quiet: bool) -> None:
    """Log the result's line; also print it unless quiet or the log shows it already."""
    if log.isEnabledFor(logging.INFO):
        log.info(result.summary())
    elif not quiet:
        sys.stderr.write(result.summary() + "\n")
