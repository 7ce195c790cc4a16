"""The validation step: run the contract on a snapshot, report, and gate.

A blocking failure (a failed rule of severity ``error``) writes the report with
``rejected.json`` and raises ``ValidationFailed``; the snapshot never becomes the dataset's
latest validated one. A crash of the validator raises ``ValidatorCrashed`` instead, so
"the data is invalid" and "the validator broke" read differently in the task log.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.errors import TrainyardError, ValidationFailed
from trainyard.validation.report import render_table, write_report
from trainyard.validation.runner import DEFAULT_BATCH_ROWS, ValidatorCrashed, run_contract

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.contracts import Contract

log = logging.getLogger(__name__)


@dataclass
class ValidationResult:
    """The outcome of validating one snapshot.

    Attributes:
        success: No blocking rule failed.
        snapshot_id: The validated snapshot.
        report_dir: ``<snapshot>/validation`` (summary.json, data_docs/, rejected.json).
        failures: Failed blocking rules (dicts: rule, column, severity, reason, counts, samples).
        warnings: Failed rules of severity ``warn``.
        table: A short table of every rule for task logs.
        rows: Rows validated.
        seconds: Wall time of the run.
        summary: The JSON summary written to the report.
    """

    success: bool
    snapshot_id: str
    report_dir: Path
    failures: list[dict[str, Any]]
    warnings: list[dict[str, Any]]
    table: str
    rows: int = 0
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)


def validate_snapshot(
    contract: Contract,
    snapshot_dir: Path,
    files: Sequence[Path],
    *,
    snapshot_id: str | None = None,
    previous_id: str | None = None,
    previous_files: Sequence[Path] | None = None,
    created_at: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    work_dir: Path | None = None,
) -> ValidationResult:
    """Validate a snapshot dir against a contract, write the report, gate.

    Args:
        contract: The dataset's contract.
        snapshot_dir: The snapshot (the report goes to ``<snapshot_dir>/validation``).
        files: Its table-view Parquet files.
        snapshot_id: Its id (defaults to the folder name).
        previous_id: The last validated snapshot's id, for drift.
        previous_files: That snapshot's table files (None: no drift check).
        created_at: Snapshot creation time (freshness without a column).
        batch_rows: Rows per batch (bounds memory).
        work_dir: Spill folder for key hashes (default: a system temporary folder).

    Returns:
        The result (success, possibly with warnings).

    Raises:
        ValidationFailed: A blocking rule failed (after the report and rejected.json).
        SnapshotError: A table file is missing or unreadable.
        ValidatorCrashed: The validator itself failed.
    """
    sid = snapshot_id or snapshot_dir.name
    try:
        run = run_contract(
            contract,
            files,
            previous_files=previous_files,
            previous_id=previous_id,
            batch_rows=batch_rows,
            work_dir=work_dir,
            created_at=created_at,
        )
    except TrainyardError:
        raise
    except Exception as e:
        raise ValidatorCrashed(
            f"validator crashed on snapshot {sid} of {contract.dataset}: {type(e).__name__}: {e}"
        ) from e
    failed = [o.to_dict() for o in run.outcomes if not o.success and o.severity == "error"]
    warned = [o.to_dict() for o in run.outcomes if not o.success and o.severity != "error"]
    table = render_table(run.outcomes)
    summary = {
        "dataset": contract.dataset,
        "snapshot_id": sid,
        "contract_version": contract.version,
        "success": not failed,
        "previous_snapshot_id": previous_id if previous_files is not None else None,
        "rows": run.rows,
        "batches": run.batches,
        "batch_rows": batch_rows,
        "seconds": round(run.seconds, 3),
        "validated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "failures": failed,
        "warnings": warned,
        "rules": [o.to_dict() for o in run.outcomes],
        "profile": _jsonable_profile(run.profile),
    }
    try:
        report_dir = write_report(snapshot_dir, summary, run.gx_result, rejected=bool(failed))
    except OSError as e:
        raise ValidatorCrashed(f"cannot write the validation report of {sid}: {e}") from e
    result = ValidationResult(
        success=not failed,
        snapshot_id=sid,
        report_dir=report_dir,
        failures=failed,
        warnings=warned,
        table=table,
        rows=run.rows,
        seconds=run.seconds,
        summary=summary,
    )
    log.info("validation of %s/%s:\n%s", contract.dataset, sid, table)
    if failed:
        reasons = "\n".join(_failure_line(f) for f in failed)
        raise ValidationFailed(
            f"snapshot {sid} of {contract.dataset} broke {len(failed)} blocking rule(s) of "
            f"contract {contract.version} (report: {report_dir}):\n{reasons}"
        )
    return result


def _jsonable_profile(profile: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The column profiles as plain JSON (category values of any column type as text)."""

    def plain(value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return str(value)

    return {col: {k: plain(v) for k, v in entry.items()} for col, entry in profile.items()}


def _failure_line(failure: dict[str, Any]) -> str:
    line = f"  {failure['rule']} {failure['column'] or ''}: {failure['reason']}"
    if failure["rows"]:
        more = ", ..." if len(failure["rows"]) > 5 else ""
        keys = failure.get("keys") or []
        if keys:  # the key finds the record in the source; a snapshot row number does not
            line += f" (keys {', '.join(repr(k) for k in keys[:5])}{more}"
        else:
            line += f" (snapshot rows {', '.join(str(r) for r in failure['rows'][:5])}{more}"
        line += f"; values {', '.join(repr(v) for v in failure['samples'][:5])})"
    return line


def validate(
    pipeline: PipelineConfig, snapshot_id: str, interval_start: str | None = None
) -> ValidationResult:
    """Validate a staged snapshot of the pipeline's dataset and mark it validated.

    Args:
        pipeline: The pipeline (its ``dataset`` names the contract and the volume).
        snapshot_id: The snapshot to validate.
        interval_start: The data interval it was staged for: drift is measured against
            the interval before it (:func:`trainyard.volumes.drift_baseline`).

    Returns:
        The result; the snapshot is now the dataset's latest validated snapshot.

    The snapshot is leased against retention while it is read, its shards are checked
    against the manifest (BLAKE3) and, for image datasets, every image is decoded, before
    the contract runs.

    Raises:
        ValidationFailed: A blocking rule failed, or an image does not decode (names the
            sample key and shard); the snapshot is rejected.
        ContractError: The contract is invalid.
        SnapshotError: The snapshot is missing, or a shard differs from its manifest
            (``snapshot <id> damaged: shard <name> ...``).
        ValidatorCrashed: The validator itself failed.
    """
    from trainyard import volumes
    from trainyard.contracts import load_contract

    contract = load_contract(pipeline.dataset)
    with volumes.lease_snapshot(pipeline.dataset, snapshot_id, purpose="validate") as sdir:
        manifest = volumes.check_snapshot(sdir)
        if manifest.kind == "files" and contract.image is not None:
            from trainyard.validation.images import check_images

            try:
                check_images(sdir, manifest)
            except ValidationFailed as e:
                _reject_images(contract, sdir, snapshot_id, str(e))
                raise
        return _validate_checked(pipeline, contract, manifest, sdir, interval_start)


def _reject_images(contract: Contract, sdir: Path, snapshot_id: str, reason: str) -> None:
    """Write the report of a snapshot rejected for an undecodable image (``rejected.json``).

    So ``snapshots list`` shows why, and re-staging its interval reads the source again.
    """
    failure = {
        "rule": "images_decode",
        "column": contract.image.column if contract.image else None,
        "severity": "error",
        "reason": reason,
        "rows": [],
        "samples": [],
    }
    summary = {
        "dataset": contract.dataset,
        "snapshot_id": snapshot_id,
        "contract_version": contract.version,
        "success": False,
        "validated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "failures": [failure],
        "warnings": [],
        "rules": [failure],
    }
    try:
        write_report(sdir, summary, None, rejected=True)
    except OSError as e:
        log.warning("cannot write the rejection report of %s: %s", snapshot_id, e)


def _validate_checked(
    pipeline: PipelineConfig,
    contract: Contract,
    manifest: Any,
    sdir: Path,
    interval_start: str | None = None,
) -> ValidationResult:
    from trainyard import volumes

    snapshot_id = manifest.snapshot_id
    previous = volumes.drift_baseline(pipeline.dataset, snapshot_id, interval_start)
    previous_files = None
    if previous is not None and contract.drift:
        previous_files = volumes.table_files(volumes.snapshot_dir(pipeline.dataset, previous))
    if manifest.contract_version and manifest.contract_version != contract.version:
        log.warning(
            "snapshot %s was staged under contract %s, validating with %s",
            snapshot_id,
            manifest.contract_version,
            contract.version,
        )
    with volumes.staging_area(pipeline.dataset, "validate") as work_dir:
        result = validate_snapshot(
            contract,
            sdir,
            volumes.table_files(sdir),
            snapshot_id=snapshot_id,
            previous_id=previous if previous_files is not None else None,
            previous_files=previous_files,
            created_at=manifest.created_at,
            work_dir=work_dir,
        )
    small = {k: result.summary[k] for k in ("contract_version", "rows", "seconds", "validated_at")}
    small["warnings"] = [f"{w['rule']} {w['column'] or ''}".strip() for w in result.warnings]
    small["previous_snapshot_id"] = result.summary["previous_snapshot_id"]
    small["report"] = str(result.report_dir / "summary.json")
    volumes.mark_validated(pipeline.dataset, snapshot_id, small)
    return result
