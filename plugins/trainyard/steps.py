"""The step table: every pipeline step declared once, with its arguments and its result.

Each step is a plain function taking names and ids and returning a JSON-serialisable dict
(an Airflow task's XCom, a pod's ``/airflow/xcom/return.json``, the CLI's stdout). The
table (:data:`STEPS`) gives each its command-line arguments and result type; from it come
the CLI (``python -m trainyard <step>``), the pods' command lines (:mod:`trainyard.pods`)
and the tasks of the one task graph (:mod:`trainyard.orchestration.graph`), so a pod can
never run a command the CLI lacks::

    stage ─▶ validate ─▶ plan ─▶ train ─▶ register ─▶ evaluate (gate) ─▶ deploy ─▶ summary

(``plan``: train, or reuse the version trained on the same inputs.)

The stage modules do the work; this module resolves configs and paths and hands results
from one step to the next.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainyard import argtypes
from trainyard.config import (
    PipelineConfig,
    TrainingConfig,
    error_message,
    load_pipeline,
)
from trainyard.errors import (
    INTERRUPTED,
    ApprovalMissing,
    ConfigError,
    DaysFailed,
    DeployError,
    RegistryError,
    RegistryRefused,
    SnapshotError,
    SourceMissing,
    StepSkipped,
    TrainyardError,
    ValidationFailed,
)
from trainyard.fsutil import atomic_write_json, read_json
from trainyard.pipelines import check, ensure_own_names
from trainyard.runs import format_summary, since
from trainyard.settings import get_settings

log = logging.getLogger("trainyard.steps")

TRAINING_OVERRIDES = ("epochs", "workers", "strategy", "priority", "batch_size", "learning_rate")


def _registry(cfg: PipelineConfig) -> Any:
    from trainyard.registry import Registry

    return Registry(get_settings().models_root, cfg.name)


def _mirror(cfg: PipelineConfig, registry: Any, version: int | None) -> None:
    """Mirror into the pipeline's tracker, if it has one (:func:`trainyard.tracking.mirror`).

    Never raises: a tracker that fails is one warning and the step goes on.
    """
    if cfg.tracking is None:
        return
    from trainyard.tracking import mirror

    mirror(cfg, registry, version)


def _snapshot_path(cfg: PipelineConfig, snapshot_id: str) -> Path:
    from trainyard import volumes

    path = volumes.snapshot_dir(cfg.dataset, snapshot_id)
    if not (path / "manifest.json").is_file():
        raise SnapshotError(
            f"snapshot {snapshot_id!r} of dataset {cfg.dataset!r} not found at {path}"
        )
    return path


def overrides_object(overrides: Any) -> dict[str, Any]:
    """The trigger form's overrides as a dict (None: none).

    Raises:
        ConfigError: If they are not a JSON object.
    """
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"overrides: expected a JSON object, got {json.dumps(overrides)[:200]}")
    return overrides


def training_params(cfg: PipelineConfig, overrides: dict[str, Any] | None) -> TrainingConfig:
    """The pipeline's training config with trigger-form overrides applied (and re-validated).

    Args:
        cfg: The pipeline config.
        overrides: Values from the trigger form; ``None`` values are ignored.

    Returns:
        The effective training config.
    """
    from pydantic import ValidationError

    unknown = sorted(set(overrides_object(overrides)) - set(TRAINING_OVERRIDES))
    if unknown:
        raise ConfigError(
            f"unknown training override(s) {unknown} (known: {', '.join(TRAINING_OVERRIDES)})"
        )
    values = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        params = TrainingConfig.model_validate({**cfg.training.model_dump(), **values})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {error_message(err)}" for err in e.errors()
        )
        raise ConfigError(f"pipeline {cfg.name}: invalid training override: {problems}") from e
    if "priority" in values:  # the form offers the tiers; a typed override is checked here
        from trainyard.k8s.profile import load_cluster_profile

        try:
            load_cluster_profile().tier(params.priority)
        except ConfigError as e:
            why = f"pipeline {cfg.name}: invalid training override: priority: {e}"
            raise ConfigError(why) from None
    return params


def _instant(name: str, text: str) -> dt.datetime:
    try:
        if text[4:5] != "-" or text[7:8] != "-":  # fromisoformat takes 20261120 too
            raise ValueError(text)
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{name} {text!r} is not an ISO date (YYYY-MM-DD) or date-time") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def check_interval(start: str | None, end: str | None, start_date: dt.date | None = None) -> None:
    """Refuse a data interval no run can have.

    That is one not in ISO form, ending before it starts, not begun, or (given the
    pipeline's ``start_date``) starting before the pipeline does. Start and end may be
    the same day: an hourly run's interval has its day as both.

    Raises:
        ConfigError: Naming the value (a step run by hand with a typo would otherwise
            stage, and record, an interval of that name).
    """
    if start is None:
        if end is not None:
            raise ConfigError(f"interval_end {end!r} without an interval_start")
        return
    begins = _instant("interval_start", start)
    if end is not None and _instant("interval_end", end) < begins:
        raise ConfigError(f"interval_end {end} is before interval_start {start}")
    if begins > dt.datetime.now(dt.UTC):
        raise ConfigError(f"interval_start {start} is in the future: its data cannot have arrived")
    if start_date is not None and begins.date() < start_date:
        raise ConfigError(
            f"interval_start {start} is before the pipeline's start_date {start_date}"
        )


def stage(
    pipeline: str,
    interval_start: str | None = None,
    interval_end: str | None = None,
    snapshot_id: str | None = None,
) -> dict[str, Any]:
    """Stage the pipeline's raw source for one data interval into a dataset snapshot.

    Args:
        pipeline: Pipeline name.
        interval_start: Data interval start (ISO date or datetime), ``None`` for ad-hoc runs.
        interval_end: Data interval end.
        snapshot_id: Use this existing snapshot instead of staging (trigger form, or the
            snapshot named by the Asset event that triggered the run).

    Returns:
        ``snapshot_id``, ``dataset``, ``reused``, ``rows``, ``bytes``, ``shards``, ``seconds``,
        ``given`` (True when ``snapshot_id`` was passed in), ``checked`` (what was actually
        listed or read, one sentence), ``replaced`` (the snapshot a changed source
        replaced for this interval, or None) and ``manifest_hash`` (BLAKE3 of its
        ``manifest.json``).
    """
    from trainyard.staging import stage as stage_source

    # names the config refers to (model, contract, metrics) are checked before any read
    cfg = check(pipeline)
    check_interval(interval_start, interval_end, cfg.start_date)
    if snapshot_id:
        path = _snapshot_path(cfg, snapshot_id)
        return {
            "snapshot_id": snapshot_id,
            "dataset": cfg.dataset,
            "path": str(path),
            "manifest_hash": _manifest_hash(path),
            "reused": True,
            "given": True,
            "checked": "snapshot given by the run (trigger form or Asset event): nothing staged",
        }
    try:
        result = stage_source(cfg, interval_start, interval_end)
    except SourceMissing as e:
        if cfg.source.when_missing == "skip":
            raise StepSkipped(f"{e}: nothing to stage (source.when_missing: skip)") from e
        raise
    out = {
        "snapshot_id": result.snapshot_id,
        "dataset": result.dataset,
        "path": str(result.path),
        "manifest_hash": _manifest_hash(result.path),
        "reused": result.reused,
        "rows": result.rows,
        "bytes": result.bytes,
        "shards": result.shards,
        "seconds": round(result.seconds, 3),
        "interval": [interval_start, interval_end],
        "interval_start": interval_start,
        "given": False,
        "checked": result.checked,
        "replaced": result.replaced,
    }
    log.info(
        "staged %s snapshot %s (%s rows, reused=%s)",
        cfg.dataset,
        result.snapshot_id,
        result.rows,
        result.reused,
    )
    return out


def _manifest_hash(snapshot: Path) -> str:
    """BLAKE3 of a snapshot's ``manifest.json`` (what lineage names the snapshot's content by)."""
    from trainyard import volumes

    return volumes.hash_file(Path(snapshot) / volumes.MANIFEST)


RULE_KEYS = ("rule", "column", "severity", "success", "unexpected_count", "element_count", "reason")
"""What ``validate``'s result keeps of each rule outcome (the report has samples and rows),
with ``observed`` when it is one value (a row count, a drift figure, a timestamp)."""


def rule_result(outcome: dict[str, Any]) -> dict[str, Any]:
    """One rule outcome of a validation report, as ``validate``'s result keeps it."""
    out = {k: outcome.get(k) for k in RULE_KEYS}
    observed = outcome.get("observed")
    if isinstance(observed, str | int | float | bool):
        out["observed"] = observed
    return out


def validate(pipeline: str, snapshot_id: str, interval_start: str | None = None) -> dict[str, Any]:
    """Validate a snapshot against its dataset's contract; raises ``ValidationFailed``.

    Once the snapshot passed, the pipeline's training window is resolved as of the run's
    interval (:func:`trainyard.volumes.training_window`): training reads exactly those
    snapshots. Without an interval (a snapshot given by the run) the window is the
    snapshot alone.

    Args:
        pipeline: Pipeline name.
        snapshot_id: The snapshot to check.
        interval_start: The run's data interval start: drift is measured against the
            interval before it, and the training window ends there.

    Returns:
        ``success``, ``snapshot_id``, ``report_dir``, ``warnings``, ``window`` (the
        snapshots to train on, oldest first: ``dataset``, ``snapshot_id``, ``interval``,
        ``rows``), ``rows`` (validated) and ``rules`` (every rule's outcome:
        :data:`RULE_KEYS` and ``observed``).
    """
    from trainyard import volumes
    from trainyard.validation import validate as run_validation

    cfg = load_pipeline(pipeline)
    result = run_validation(cfg, snapshot_id, interval_start)  # it logs its table
    window = cfg.training.window if interval_start else "newest"
    entries, gaps = volumes.window_with_gaps(cfg.dataset, window, snapshot_id, interval_start)
    if gaps:
        said = "; ".join(f"{start[:10]}: {why}" for start, why in gaps)
        if cfg.training.window_gaps == "fail":
            raise SnapshotError(
                f"the training window of {cfg.name} ({_window_text(window)} as of "
                f"{interval_start}) lacks {len(gaps)} interval(s): {said}. Stage them again "
                f"(python -m trainyard run --pipeline {cfg.name} --ds DAY), or set "
                "training.window_gaps: train to train on what is left"
            )
        log.warning("training window lacks %d interval(s): %s", len(gaps), said)
    log.info(
        "training window %s as of %s: %d snapshot(s), %d rows: %s",
        _window_text(window),
        interval_start or "-",
        len(entries),
        sum(e["rows"] for e in entries),
        ", ".join(e["snapshot_id"] for e in entries),
    )
    return {
        "success": result.success,
        "snapshot_id": result.snapshot_id,
        "report_dir": str(result.report_dir),
        "warnings": len(result.warnings),
        "window": entries,
        "lacks": [start for start, _ in gaps],
        "rows": result.rows,
        "rules": [rule_result(r) for r in result.summary.get("rules", [])],
    }


def _window_text(window: Any) -> str:
    if hasattr(window, "model_dump"):
        window = window.model_dump(mode="json")
    return window if isinstance(window, str) else json.dumps(window, sort_keys=True)


def window_ids(snapshot_id: str, window: list[Any] | None) -> list[str]:
    """The snapshot ids of a window (``validate``'s entries or plain ids), else the one.

    Raises:
        ConfigError: If the window is not a list of ids or entries.
    """
    if not window:
        return [snapshot_id]
    ids = []
    for item in window:
        sid = item.get("snapshot_id") if isinstance(item, dict) else item
        if not isinstance(sid, str) or not sid:
            raise ConfigError(f"training window entry {item!r} names no snapshot id")
        ids.append(sid)
    return list(dict.fromkeys(ids))


def train(
    pipeline: str,
    snapshot_id: str,
    run_id: str,
    overrides: dict[str, Any] | None = None,
    log_line: Callable[[str], None] | None = None,
    window: list[Any] | None = None,
    force_retrain: bool = False,
) -> dict[str, Any]:
    """Train a candidate by running the run's training Jobs locally, then register it.

    The Jobs are the ones the kubernetes runner submits; here each pod is a process
    (:func:`trainyard.training.launcher.run_training`). A version trained on the same
    inputs (:func:`trainyard.training.reuse.plan_training`) is reused instead, unless
    ``force_retrain``: nothing trains, and the result names that version.

    Args:
        pipeline: Pipeline name.
        snapshot_id: Validated snapshot to train on.
        run_id: The run (names checkpoints and the output folder).
        overrides: Trigger-form overrides of the training config.
        log_line: Where worker log lines go (the task log); defaults to logging.
        window: The snapshots to train on (``validate``'s ``window``); default: the one.
        force_retrain: Train even if a version was trained on the same inputs.

    Returns:
        :func:`register`'s result: ``version`` (the registered or reused candidate),
        ``metrics``, ``attempts``, ``seconds``, ``reused``, ``decision``.
    """
    from trainyard.training.launcher import run_training
    from trainyard.training.reuse import plan_training
    from trainyard.volumes import validation_state

    cfg = load_pipeline(pipeline)
    params = training_params(cfg, overrides)
    ids = window_ids(snapshot_id, window)
    for sid in ids:
        state = validation_state(_snapshot_path(cfg, sid))
        if state["state"] == "rejected":  # by hand: the DAG trains on validated ones only
            raise ValidationFailed(
                f"snapshot {sid} of {cfg.dataset} was rejected by validation "
                f"({state['reason']}): no model is trained on it; correct the source and "
                "stage again"
            )
        if state["state"] != "validated":
            log.warning("snapshot %s of %s has not been validated", sid, cfg.dataset)
    plan = plan_training(cfg, params, ids, force_retrain)
    log.info("training: %s", plan.line)
    if plan.reuse is not None:
        return register(pipeline, snapshot_id, run_id, reused=plan.reuse, decision=plan.line)
    result = run_training(cfg, params, snapshot_id, run_id, log=log_line, window=ids)
    return register(
        pipeline,
        snapshot_id,
        run_id,
        params.model_dump(),
        result.seconds,
        result.attempts,
        plan.fingerprint.to_dict(),
        decision=plan.line,
    )


def plan(
    pipeline: str,
    snapshot_id: str,
    window: list[Any] | None = None,
    overrides: dict[str, Any] | None = None,
    force_retrain: bool = False,
    trainer_image: str | None = None,
) -> dict[str, Any]:
    """Whether a run trains, or reuses the version trained on the same inputs.

    The ``train`` task runs it before anything trains, on both runners (a local process,
    or a pod that reads the models volume before the kubernetes runner creates a Job);
    ``train`` by hand and ``trainyard run`` take the same decision in-process
    (:func:`trainyard.training.reuse.plan_training`).

    Args:
        pipeline: Pipeline name.
        snapshot_id: The run's snapshot.
        window: The snapshots it would train on (``validate``'s ``window``).
        overrides: Trigger-form overrides of the training config.
        force_retrain: Train even if a version was trained on the same inputs.
        trainer_image: The cluster's trainer image (kubernetes runner); None: training
            runs here.

    Returns:
        ``training`` (the effective config), ``fingerprint``, ``reused`` (the version to
        reuse, or None: train) and ``decision`` (why, one sentence).
    """
    from trainyard.training.reuse import plan_training

    cfg = load_pipeline(pipeline)
    params = training_params(cfg, overrides)
    decided = plan_training(
        cfg, params, window_ids(snapshot_id, window), force_retrain, trainer_image
    )
    log.info("training: %s", decided.line)
    return decided.result()


def should_train(policy: str, run_type: str, later_runs_queued: int) -> tuple[bool, str]:
    """Whether this run trains, given the pipeline's backfill policy.

    Args:
        policy: ``last``, ``each`` or ``none`` (``PipelineConfig.backfill_training``).
        run_type: The DagRun's run type (``backfill``, ``scheduled``, ``manual``, ...).
        later_runs_queued: How many runs of this DAG are still queued.

    Returns:
        (train or not, the reason in one sentence).
    """
    if run_type != "backfill" or policy == "each":
        return True, "train"
    if policy == "none":
        return (
            False,
            "backfill run: the pipeline trains on no backfill run (backfill_training: none)",
        )
    if later_runs_queued:
        return False, (
            f"backfill run with {later_runs_queued} later interval(s) still queued: "
            "training happens once, in the backfill's last run"
        )
    return True, "last run of the backfill: training on the window as of its interval"


def _remove_run_folder(cfg: PipelineConfig, run_id: str) -> Path:
    """Remove a training run's folder (its checkpoints and output); return where it was."""
    import shutil

    from trainyard.layout import Layout

    folder = Layout(get_settings().volume_root).checkpoints(cfg.name, run_id)
    shutil.rmtree(folder, ignore_errors=True)
    return folder


STALE_RUN_DAYS = 7
"""A training run's checkpoints nothing wrote for this long belong to a run nobody retried."""


def remove_stale_runs(runs: Path, older_than_days: float = STALE_RUN_DAYS) -> list[Path]:
    """Remove the run folders under ``runs`` in which nothing changed for ``older_than_days``.

    A killed training run keeps its checkpoints so that a retry resumes; one that no
    retry took for that long only fills the volume. A run still training writes a
    checkpoint each epoch, so its folder is never this old.

    Returns:
        The folders removed.
    """
    import shutil

    cutoff = time.time() - older_than_days * 86400
    removed = []
    for run in sorted(runs.iterdir()) if runs.is_dir() else ():
        if not run.is_dir() or run.is_symlink():
            continue
        try:
            newest = max(
                [run.lstat().st_mtime]
                + [(Path(d) / f).lstat().st_mtime for d, _, fs in os.walk(run) for f in fs]
            )
        except OSError:  # changing now: not stale
            continue
        if newest < cutoff:
            shutil.rmtree(run, ignore_errors=True)
            removed.append(run)
    return removed


def register(
    pipeline: str,
    snapshot_id: str,
    run_id: str,
    training: dict[str, Any] | None = None,
    seconds: float | None = None,
    attempts: int | None = None,
    fingerprint: dict[str, Any] | None = None,
    reused: int | None = None,
    decision: str | None = None,
) -> dict[str, Any]:
    """Register a run's training output as a numbered version (or name the one reused).

    The output is where the run's chief wrote it (:func:`trainyard.training.spec.run_paths`
    on the volume root); after registering it is removed, with the run's checkpoints,
    and so are those of the pipeline's runs untouched for :data:`STALE_RUN_DAYS` (killed
    and never retried: :func:`remove_stale_runs`). A run that reused a version trained
    on the same inputs (``reused``) registers nothing: the result is that version's.

    Args:
        pipeline: Pipeline name.
        snapshot_id: The snapshot the run trained on.
        run_id: The run.
        training: The run's effective training config (recorded as the version's params).
        seconds: Training wall-clock time.
        attempts: Training attempts used.
        fingerprint: The training's fingerprint (:mod:`trainyard.training.reuse`), kept in
            the version's metadata: a later run on the same inputs reuses the version.
        reused: The version the run reused instead of training.
        decision: Why it trained or reused, in one sentence (the run's summary shows it).

    Returns:
        ``version``, ``metrics``, ``attempts``, ``seconds``, ``snapshots`` (the ids it
        was trained on), ``reused`` (bool), ``decision``, ``window`` (what it read: each
        snapshot's ``interval`` and ``rows``) and ``rows``.
    """
    from trainyard.contracts import load_contract
    from trainyard.layout import Layout
    from trainyard.training.spec import TENSORBOARD_DIR, run_paths
    from trainyard.training.worker.transform import TRANSFORM_FILE

    cfg = load_pipeline(pipeline)
    if reused is not None:
        return _reused_version(cfg, int(reused), decision)
    params = TrainingConfig.model_validate(
        {**cfg.training.model_dump(), **(training or {})}
    ).model_dump()
    paths = run_paths(Layout(get_settings().volume_root), cfg, snapshot_id, run_id)
    out = Path(paths.output)
    model_dir = out / "model"
    if not (model_dir / "saved_model.pb").is_file():
        raise RegistryError(f"training output {model_dir} holds no SavedModel")
    metrics = read_json(out / "metrics.json") if (out / "metrics.json").is_file() else {}
    inputs = read_json(out / "inputs.json") if (out / "inputs.json").is_file() else {}
    transform = read_json(out / TRANSFORM_FILE) if (out / TRANSFORM_FILE).is_file() else None
    read = inputs.get("snapshots") or [{"dataset": cfg.dataset, "snapshot_id": snapshot_id}]
    metadata = {
        "pipeline": cfg.name,
        "dataset": cfg.dataset,
        "snapshot_id": snapshot_id,
        "snapshots": read,
        "window": params["window"],
        "rows": inputs.get("rows"),
        "data_until": data_until(read),
        "contract_version": load_contract(cfg.dataset).version,
        "config_hash": cfg.config_hash(),
        "image": get_settings().image,
        "run_id": run_id,
        "training": params,
        "train_metrics": metrics,
        "transform": transform,
        "timings": {"train_seconds": seconds, "attempts": attempts},
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "fingerprint": fingerprint,
        "determinism": inputs.get("determinism"),
    }
    names = ("metrics.json", "history.json", "inputs.json", TRANSFORM_FILE)
    extra = [out / name for name in names if (out / name).is_file()]
    if (out / TENSORBOARD_DIR).is_dir():
        extra.append(out / TENSORBOARD_DIR)
    registry = _registry(cfg)
    version = registry.register(model_dir, metadata, extra_files=extra)
    for stale in remove_stale_runs(_remove_run_folder(cfg, run_id).parent):
        log.info("removed the checkpoints of a run untouched for a week: %s", stale)
    log.info(
        "registered %s version %d (trained on %d snapshot(s), %s rows: %s)",
        cfg.name,
        version,
        len(read),
        inputs.get("rows", "?"),
        ", ".join(str(s.get("snapshot_id")) for s in read),
    )
    _mirror(cfg, registry, version)
    return {
        "version": version,
        "metrics": metrics,
        "attempts": attempts,
        "seconds": seconds,
        "snapshots": [str(s.get("snapshot_id")) for s in read],
        "reused": False,
        "decision": decision,
        "window": read,
        "rows": inputs.get("rows"),
    }


def _reused_version(cfg: PipelineConfig, version: int, decision: str | None) -> dict[str, Any]:
    """``register``'s result for a run that reused ``version`` (trained on its inputs)."""
    meta = _registry(cfg).metadata(version)
    read = [s for s in meta.get("snapshots") or [] if isinstance(s, dict)]
    log.info("%s version %d reused: %s", cfg.name, version, decision or "same inputs")
    return {
        "version": version,
        "metrics": meta.get("train_metrics") or {},
        "attempts": 0,
        "seconds": 0.0,
        "snapshots": [str(s.get("snapshot_id")) for s in read],
        "reused": True,
        "decision": decision or f"unchanged since version {version}: reused, 0 s",
        "window": read,
        "rows": meta.get("rows"),
    }


def data_until(snapshots: list[dict[str, Any]]) -> str | None:
    """The newest data a model read (:func:`trainyard.volumes.data_until`)."""
    from trainyard.volumes import data_until as newest

    return newest(snapshots)


def evaluate(
    pipeline: str,
    version: int,
    force_promote: bool = False,
    force_reason: str | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Evaluate the candidate, the champion and the versions served before on one holdout, and gate.

    The decision report is written next to the candidate (``gate.md`` / ``gate.json``).
    The champion as its own candidate (a run that reused it) is kept: the verdict is
    ``keep``, the report is the run's (its gate record says what it beat when it shipped).

    Returns:
        ``promote``, ``verdict``, ``reason``, ``version``, ``champion``, ``metrics``,
        ``champion_metrics``, ``report`` (markdown).
    """
    from trainyard.evaluation.gate import ForceRequest
    from trainyard.evaluation.step import evaluate_and_decide
    from trainyard.registry import caller

    cfg = load_pipeline(pipeline)
    registry = _registry(cfg)
    force = None
    if force_promote:
        force = ForceRequest(
            actor=actor or caller(),
            reason=force_reason or "",
            at=dt.datetime.now(dt.UTC).isoformat(),
        )
    decision = evaluate_and_decide(cfg, registry, int(version), force)
    log.info("gate decision for %s v%s:\n%s", cfg.name, version, decision.to_markdown())
    _mirror(cfg, registry, int(version))
    return decision.summary()


def _version_text(version: int | None) -> str:
    return "none" if version is None else f"version {version}"


def ensure_gated_against_champion(
    pipeline: str, champion: int | None, version: int, gate: dict[str, Any]
) -> None:
    """Refuse to ship a version whose gate compared it with another champion than today's.

    An old candidate (an old run's deploy, by hand or cleared) would otherwise demote a
    newer champion its gate never saw. The champion itself (a redeploy) and a forced
    verdict pass.

    Raises:
        DeployError: Naming both champions and the ways out.
    """
    gated_against = gate.get("champion_version")
    if gate.get("verdict") != "promote" or version == champion or gated_against == champion:
        return
    raise DeployError(
        f"{pipeline} version {version} was gated against champion "
        f"{_version_text(gated_against)} and the champion is now {_version_text(champion)}: "
        f"evaluate it again (python -m trainyard evaluate --pipeline {pipeline} --version "
        f"{version}), or make it the champion by hand (python -m trainyard models promote "
        f"--pipeline {pipeline} {version} --reason ...)"
    )


def promotion_reason(meta: dict[str, Any], gate: dict[str, Any]) -> str:
    """Why the deploy step makes a version the champion, as its history records it.

    A forced gate's reason is the person's who forced it, in their words.
    """
    force = gate.get("force") if gate.get("verdict") == "forced" else None
    if isinstance(force, dict) and force.get("reason"):
        return f"forced by {force.get('actor')}: {force['reason']}"
    return f"deployed after gate on snapshot {meta['snapshot_id']}"


def deploy(pipeline: str, version: int, actor: str | None = None) -> dict[str, Any]:
    """Publish a gated version to serving, smoke-test it, and make it the champion.

    Serving is first put back on the registry's champion (which undoes what a killed
    deploy left), then the version is served as ``canary`` and smoke-tested. On a failed
    smoke test serving rolls back to the previous champion and ``DeployError`` is raised;
    the champion pointer only moves after the new version answered correctly. A version
    that needs a person's approval (``gate.approval: required``) ships only on the answer
    the registry holds for it (:func:`approval`, written from Airflow's record of the
    ``approve`` task or by ``models approve``): that person is the promotion's actor.

    Returns:
        ``version``, ``url``, ``sample_prediction``, ``smoke_rows``, ``previous``,
        ``scorer`` (the stream scorer it started or restarted: :func:`roll_scorer`).
    """
    from trainyard.contracts import feature_spec, load_contract
    from trainyard.evaluation.step import smoke_examples
    from trainyard.registry import caller
    from trainyard.serving.deploy import deploy as deploy_version
    from trainyard.serving.deploy import ensure_local_server, serve_champion
    from trainyard.settings import serving_endpoint

    cfg = load_pipeline(pipeline)
    ensure_own_names(cfg)
    settings = get_settings()
    registry = _registry(cfg)
    version = int(version)
    meta = registry.metadata(version)
    contract = load_contract(cfg.dataset)
    gate = registry.read_file(version, "gate.json") or {}
    if gate.get("verdict") not in ("promote", "forced"):
        reason = gate.get("reason") or "it has not been evaluated (run the evaluate step first)"
        raise DeployError(f"{cfg.name} version {version} may not be deployed: {reason}")
    # the champion read here is the one served, replaced and restored on failure: no other
    # deploy, promote or rollback of the pipeline may move it meanwhile
    with registry.deploy_lock():
        previous = registry.champion()
        ensure_gated_against_champion(cfg.name, previous, version, gate)
        promote_reason = promotion_reason(meta, gate)
        if cfg.gate.approval == "required":
            answer = registry.read_file(version, "approval.json") or {}
            if not answer.get("approved"):
                said = (
                    "nobody has approved it"
                    if not answer
                    else "its approval request waits for an answer"
                    if answer.get("approved") is None
                    else f"{answer.get('actor')} rejected it: "
                    f"{answer.get('reason') or '(no reason)'}"
                )
                raise ApprovalMissing(
                    f"{cfg.name} version {version} needs a person's approval (gate.approval: "
                    f"required) and {said}; approve it in the Airflow UI (Required Actions) or "
                    f"with python -m trainyard models approve --pipeline {cfg.name} {version} "
                    "--reason '...'"
                )
            actor = str(answer.get("actor"))
            promote_reason = f"approved by {actor}: {answer.get('reason') or '(no reason given)'}"
        smoke = smoke_examples(cfg, registry, version, cfg.serving.smoke_rows)
        spec = feature_spec(contract)
        champion_dir = registry.version_dir(previous) / "model" if previous is not None else None
        log.info(
            "before the deploy: %s",
            serve_champion(
                settings.serving_root, cfg.serving.model_name, previous, champion_dir, spec
            ),
        )
        # On a cluster the deploy pod reaches TF Serving through its Service; locally the
        # step starts the server itself when nothing answers on the port.
        endpoint = serving_endpoint(cfg, settings)
        if endpoint.local:
            ensure_local_server(settings.serving_root, endpoint.host, endpoint.port)
        result = deploy_version(
            model_name=cfg.serving.model_name,
            version=version,
            model_dir=registry.version_dir(version) / "model",
            serving_root=settings.serving_root,
            host=endpoint.host,
            port=endpoint.port,
            smoke_inputs=smoke.features,
            expected=smoke.expected,
            feature_spec=spec,
            previous_version=previous,
            timeout_s=120.0,
            promote=lambda: registry.promote(
                version, reason=promote_reason, actor=actor or caller()
            ),
        )
    _mirror(cfg, registry, None)
    return {
        "version": version,
        "previous": previous,
        "url": result.url,
        "sample_prediction": result.sample_prediction,
        "sample_key": smoke.keys[0] if len(smoke.keys) else None,
        "smoke_rows": result.smoke_rows,
        "scorer": roll_scorer(cfg, local=endpoint.local),
    }


APPROVAL_DECISIONS = ("pending", "approved", "rejected")
"""What ``approval`` records: asked and not answered yet, or a person's answer."""


def approval(
    pipeline: str,
    version: int,
    decision: str,
    by: str | None = None,
    reason: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Record the answer to a candidate's approval request: the registry's one writer of it.

    The ``approve`` task runs it with the answer Airflow recorded for the request (its
    human-in-the-loop record, never an XCom), ``models approve|reject`` with the caller's.
    ``pending`` (the request asked, or asked again after ``approve`` was cleared) withdraws
    an earlier answer, so no deploy ships on it. Rejecting the version that is the
    champion (``approve`` cleared and answered again after it shipped) rolls the champion
    back, and serving follows, so registry, serving and the run's page tell one story.

    Args:
        pipeline: Pipeline name.
        version: The candidate asked about.
        decision: One of :data:`APPROVAL_DECISIONS`.
        by: Who answered (``pending``: who asked, if anyone).
        reason: What they wrote.
        run_id: The run that asked.

    Returns:
        ``version``, ``decision``, ``by``, ``reason``, ``rolled_back`` (the champion after
        a rollback this rejection caused, as ``served``), ``served``.

    Raises:
        ConfigError: On an unknown decision, or a pipeline that asks no approval.
    """
    from trainyard.registry import caller

    if decision not in APPROVAL_DECISIONS:
        raise ConfigError(f"decision {decision!r}: expected one of {', '.join(APPROVAL_DECISIONS)}")
    cfg = load_pipeline(pipeline)
    if cfg.gate.approval != "required":
        raise RegistryRefused(
            f"pipeline {pipeline!r} does not ask for approval (gate.approval: "
            f"{cfg.gate.approval}): its gate alone decides; nothing was recorded"
        )
    registry = _registry(cfg)
    version = int(version)
    actor = by or ("nobody yet" if decision == "pending" else caller())
    approved = {"pending": None, "approved": True, "rejected": False}[decision]
    out: dict[str, Any] = {"version": version, "decision": decision, "by": actor}
    out["reason"] = reason or ""
    with registry.deploy_lock():
        registry.record_approval(version, approved, actor, reason or "", run_id=run_id)
        rolled_back = decision == "rejected" and registry.champion() == version
        if rolled_back:
            registry.rollback(
                f"rejected by {actor} after it shipped: {reason or '(no reason given)'}",
                actor,
                unserve=True,
            )
        out["rolled_back"] = rolled_back
        out["served"] = follow_registry(pipeline) if rolled_back else None
    log.info(
        "%s version %d: %s by %s%s",
        cfg.name,
        version,
        decision,
        actor,
        f"; the champion was rolled back: {out['served']}" if rolled_back else "",
    )
    return out


def roll_scorer(cfg: PipelineConfig, local: bool) -> str | None:
    """Start or restart the pipeline's stream scorer (``scoring.stream``), if it has one.

    Locally a supervised detached process (``trainyard.streaming.local_scorer``); on a cluster
    the scorer Deployment (``render --step scorer``) is the runner's to roll.

    Returns:
        One line saying what runs, or None when the pipeline scores no stream.
    """
    if cfg.scoring.stream is None:
        return None
    if not local:
        return "scorer: the cluster's scorer Deployment follows the stable label"
    from trainyard.streaming.local_scorer import local_scorer_pids_text, start_local_scorer

    pids = local_scorer_pids_text(cfg.name, start_local_scorer(cfg.name))
    return f"scorer running ({pids}) on {cfg.scoring.stream.engine} {cfg.scoring.stream.input}"


def start_scorer_if_stopped(cfg: PipelineConfig, local: bool) -> str | None:
    """Start the pipeline's stream scorer if it has one and none runs here.

    After ``models promote`` or ``rollback``: a running scorer follows the served version
    by itself and is left alone; one stopped (``make stop``) is started as a deploy would.

    Returns:
        One line saying what runs, or None when there is nothing to run here.
    """
    if cfg.scoring.stream is None or not local:
        return None
    from trainyard.streaming.local_scorer import local_scorer_pid, local_scorer_pids_text

    pid = local_scorer_pid(cfg.name)
    if pid is not None:
        pids = local_scorer_pids_text(cfg.name, pid)
        return f"scorer running ({pids}), following the served version"
    return roll_scorer(cfg, local=True)


def follow_registry(pipeline: str) -> str:
    """Serve the pipeline's registry champion (after ``models promote`` / ``rollback``).

    Writes the model config the servers poll (publishing the champion's folder again if it
    was removed), then waits for the server to answer from the champion: locally the
    server is started if none answers (as the deploy step does); a server elsewhere
    (``TRAINYARD_SERVING_HOST``) that does not serve it within a minute is said so.
    Locally the stream scorer is started too if the pipeline has one and it is stopped
    (:func:`start_scorer_if_stopped`).

    Returns:
        One line saying what is served now, and where.
    """
    from trainyard.contracts import feature_spec, load_contract
    from trainyard.serving.client import ServingClient
    from trainyard.serving.deploy import ensure_local_server, serve_champion, wait_available
    from trainyard.settings import serving_endpoint

    cfg = load_pipeline(pipeline)  # its names were checked before the move
    settings = get_settings()
    registry = _registry(cfg)
    champion = registry.champion()
    model_dir = registry.version_dir(champion) / "model" if champion is not None else None
    spec = feature_spec(load_contract(cfg.dataset))
    served = serve_champion(
        settings.serving_root, cfg.serving.model_name, champion, model_dir, spec
    )
    if champion is not None:
        endpoint = serving_endpoint(cfg, settings)
        where = endpoint.address
        try:
            if endpoint.local:
                ensure_local_server(settings.serving_root, endpoint.host, endpoint.port)
            with ServingClient(endpoint.host, endpoint.port) as client:
                wait_available(client, cfg.serving.model_name, champion, 60.0)
            served += f" on {where}"
        except (TrainyardError, OSError) as e:
            served += f"; but the server on {where} does not serve it yet: {e}"
        try:
            scorer = start_scorer_if_stopped(cfg, local=endpoint.local)
        except TrainyardError as e:
            scorer = f"the stream scorer did not start: {e}"
        if scorer is not None:
            served += f"; {scorer}"
    _mirror(cfg, registry, None)
    return served


def summary(
    pipeline: str,
    run_id: str | None = None,
    results: dict[str, Any] | None = None,
    log_it: bool = True,
) -> dict[str, Any]:
    """Record a run's results (``runs/<run>.json``, ``last_run.json``), or read one back.

    Args:
        pipeline: Pipeline name.
        run_id: The run; ``None`` returns the last recorded run.
        results: Each step's return value keyed by step name (missing when skipped);
            ``None`` returns the record of ``run_id``.
        log_it: Log the recorded summary (``run`` prints its last one instead).

    Returns:
        The record (written, or read back).

    Raises:
        RegistryError: If no run was recorded yet and none is given, or ``run_id`` was
            not recorded and no ``results`` are given.
    """
    from trainyard.layout import Layout

    cfg = load_pipeline(pipeline)
    layout = Layout(get_settings().volume_root)
    if run_id is None:
        path = layout.last_run(cfg.name)
        if not path.is_file():
            raise RegistryError(f"no run of pipeline {cfg.name!r} recorded yet ({path})")
        return read_json(path)
    if results is None:  # by hand, a run to show: a typo must not record a run of that name
        path = layout.run_record(cfg.name, run_id)
        if not path.is_file():
            raise RegistryRefused(
                f"no run {run_id!r} of pipeline {cfg.name!r} recorded (runs in {path.parent}); "
                "--results records one"
            )
        return read_json(path)
    record = {
        "pipeline": cfg.name,
        "run_id": run_id,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        **{k: v for k, v in (results or {}).items() if k != "approve"},
    }
    version = ((results or {}).get("register") or {}).get("version")
    if (
        cfg.gate.approval == "required"
        and version is not None
        and (results or {}).get("evaluate", {}).get("promote")
    ):
        record["approve"] = _registry(cfg).approval_answer(int(version))
    atomic_write_json(layout.run_record(cfg.name, run_id), record)
    atomic_write_json(layout.last_run(cfg.name), record)
    if log_it:
        log.info("run summary:\n%s", format_summary(record))
    return record


DAILY = "0 0 * * *"
"""The intervals of a pipeline without a schedule: days (UTC)."""


def latest_interval(schedule: str | None, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The latest data interval of a schedule complete at ``now`` (UTC; days without one).

    What a run without a data interval of its own covers (``trainyard run`` without
    ``--ds``, a DAG run triggered with no logical date): never the interval still going
    on, whose data are not all there.
    """
    from croniter import croniter

    it = croniter(schedule or DAILY, now.astimezone(dt.UTC))
    end = it.get_prev(dt.datetime)
    return it.get_prev(dt.datetime), end


def data_intervals(
    cfg: PipelineConfig, first: dt.date | None = None, last: dt.date | None = None
) -> list[tuple[str, str]]:
    """The data intervals the DAG's timetable makes, for ``trainyard run``.

    As Airflow's cron timetable (UTC): an interval runs from one fire of the pipeline's
    cron to the next, named by its start. A pipeline without a schedule has one interval
    per day.

    Args:
        cfg: The pipeline.
        first: First day whose intervals to return; None: the latest complete interval.
        last: Last such day (default: ``first``).

    Returns:
        ``(start, end)`` ISO datetimes, oldest first.

    Raises:
        ConfigError: If ``last`` is before ``first`` or after today, ``first`` is before
            the pipeline's ``start_date``, or the range has no interval.
    """
    from croniter import croniter

    cron = cfg.schedule or DAILY
    utc = dt.UTC
    if first is None:
        start, end = latest_interval(cfg.schedule, dt.datetime.now(utc))
        return [(start.isoformat(), end.isoformat())]
    last = last or first
    if last < first:
        raise ConfigError(f"--end-ds {last} is before --ds {first}")
    today = dt.datetime.now(utc).date()
    if last > today:
        flag = "--end-ds" if last != first else "--ds"
        raise ConfigError(f"{flag} {last} is after today ({today}): its data cannot have arrived")
    if first < cfg.start_date:
        raise ConfigError(f"--ds {first} is before the pipeline's start_date {cfg.start_date}")
    lo = dt.datetime.combine(first, dt.time(), utc)
    hi = dt.datetime.combine(last + dt.timedelta(days=1), dt.time(), utc)
    it = croniter(cron, lo - dt.timedelta(microseconds=1))
    out = []
    start = it.get_next(dt.datetime)
    while start < hi:
        end = it.get_next(dt.datetime)
        out.append((start.isoformat(), end.isoformat()))
        start = end
    if not out:
        raise ConfigError(f"schedule {cron!r} has no interval starting from {first} to {last}")
    if dt.datetime.fromisoformat(out[-1][1]) > dt.datetime.now(utc):
        flag = "--end-ds" if last != first else "--ds"
        raise ConfigError(
            f"{flag} {last}: its interval {out[-1][0]} to {out[-1][1]} has not ended, so its "
            "data is not complete (a DAG run of it would not have started yet)"
        )
    return out


# --------------------------------------------------------------------------- the table

EXIT_OK = 0
EXIT_FAILED = 1
"""A step failed in a way a retry may fix (a crash, a lost connection, a killed worker)."""
EXIT_USAGE = 2
EXIT_DETERMINISTIC = 3
"""A step failed in a way no retry fixes (bad config or data, a rejection, a damaged
snapshot): the orchestrator fails the task without retrying."""
EXIT_SKIPPED = 4
"""A step had nothing to do (a missing partition with ``source.when_missing: skip``): the
orchestrator skips the task and what depends on it, with the step's reason."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT), as a shell reports it: the run stops, nothing retries."""

ArgKind = Literal["str", "int", "float", "bool", "json"]


@dataclass(frozen=True)
class Arg:
    """One argument of a step: a keyword of its function and a flag of its command.

    Attributes:
        name: The function's keyword (``snapshot_id``); the flag is ``--snapshot-id``.
        kind: How the value is written on the command line and parsed back.
        required: Whether the command refuses to run without it.
        help: One line for ``--help``.
    """

    name: str
    kind: ArgKind = "str"
    required: bool = False
    help: str = ""

    @property
    def flag(self) -> str:
        """The command-line flag."""
        return "--" + self.name.replace("_", "-")

    def to_text(self, value: Any) -> str:
        """The value as this argument's command-line text."""
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind == "json":
            return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        if self.kind == "float":
            return repr(float(value))
        return str(value)

    def parse(self, text: str) -> Any:
        """The value of this argument's command-line text (argparse ``type``)."""
        if self.kind == "int":
            return int(text)
        if self.kind == "float":
            return float(text)
        if self.kind == "bool":
            if text not in ("true", "false"):
                raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
            return text == "true"
        if self.kind == "json":
            try:
                return json.loads(text)
            except json.JSONDecodeError as e:
                raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from e
        return text


@dataclass(frozen=True)
class Step:
    """A pipeline step: its function, its arguments, its result, where it runs.

    Attributes:
        name: The command and task name.
        fn: The function (keywords = :attr:`args` names).
        args: Its arguments, in command-line order.
        result: The result's keys, for readers of the XCom (documentation and tests).
        help: One line for the CLI.
        writes_dataset: Whether its pod mounts the dataset volume read-write.
        libraries: The heavy libraries its work imports (Great Expectations, TensorFlow):
            its process imports them before the work starts, so the start-up it logs
            (:func:`run_step`) counts them.
    """

    name: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Arg, ...]
    result: tuple[str, ...]
    help: str
    writes_dataset: bool = False
    libraries: tuple[str, ...] = ()

    def argv(self, values: dict[str, Any]) -> list[str]:
        """The command-line arguments for ``values`` (``None`` values left out).

        Args:
            values: Keyword → value; every key must be one of :attr:`args`.

        Returns:
            ``["--flag", "text", ...]`` in table order.

        Raises:
            ConfigError: On an unknown key or a missing required value.
        """
        known = {a.name for a in self.args}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"step {self.name}: unknown argument(s) {unknown}")
        out: list[str] = []
        for arg in self.args:
            value = values.get(arg.name)
            if value is None:
                if arg.required:
                    raise ConfigError(f"step {self.name}: {arg.flag} is required")
                continue
            out += [arg.flag, arg.to_text(value)]
        return out

    def parser(self, prog: str = "python -m trainyard") -> argparse.ArgumentParser:
        """The command's argument parser, generated from :attr:`args`."""
        p = argtypes.ArgumentParser(prog=f"{prog} {self.name}", description=self.help)
        for arg in self.args:
            p.add_argument(
                arg.flag, dest=arg.name, type=arg.parse, required=arg.required, help=arg.help
            )
        return p

    def parse(self, argv: list[str]) -> dict[str, Any]:
        """The function's keywords from a command line (exits 2 on a usage error)."""
        return vars(self.parser().parse_args(argv))

    def run(self, argv: list[str]) -> dict[str, Any]:
        """Parse a command line and call the step."""
        return self.fn(**self.parse(argv))


REGISTERED = (
    "version",
    "metrics",
    "attempts",
    "seconds",
    "snapshots",
    "reused",
    "decision",
    "window",
    "rows",
)
"""The result of ``train`` and ``register``."""


def _pipeline() -> Arg:
    return Arg("pipeline", required=True, help="pipeline name (dags/pipelines/<name>.yaml)")


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(
            "stage",
            stage,
            (
                _pipeline(),
                Arg("interval_start", help="data interval start (YYYY-MM-DD)"),
                Arg("interval_end", help="data interval end (YYYY-MM-DD)"),
                Arg("snapshot_id", help="use this existing snapshot instead of staging"),
            ),
            (
                "snapshot_id",
                "dataset",
                "path",
                "manifest_hash",
                "reused",
                "rows",
                "bytes",
                "shards",
                "given",
            ),
            "Stage a pipeline's raw source into a dataset snapshot.",
            writes_dataset=True,
        ),
        Step(
            "validate",
            validate,
            (
                _pipeline(),
                Arg("snapshot_id", required=True, help="the snapshot to check"),
                Arg("interval_start", help="the run's interval start (ends the training window)"),
            ),
            (
                "success",
                "snapshot_id",
                "report_dir",
                "warnings",
                "window",
                "lacks",
                "rows",
                "rules",
            ),
            "Validate a snapshot against its data contract.",
            # the report goes into the snapshot; validated.json is updated
            writes_dataset=True,
            libraries=("great_expectations",),
        ),
        Step(
            "plan",
            plan,
            (
                _pipeline(),
                Arg("snapshot_id", required=True, help="the run's snapshot"),
                Arg("window", "json", help="snapshots to train on (validate's window, JSON)"),
                Arg("overrides", "json", help="JSON object of training overrides"),
                Arg(
                    "force_retrain",
                    "bool",
                    help="train even if a version was trained on the same inputs",
                ),
                Arg("trainer_image", help="the cluster's trainer image (kubernetes runner)"),
            ),
            ("training", "fingerprint", "reused", "decision"),
            "Decide whether a run trains, or reuses the version trained on the same inputs.",
        ),
        Step(
            "train",
            train,
            (
                _pipeline(),
                Arg("snapshot_id", required=True, help="validated snapshot to train on"),
                Arg("run_id", required=True, help="names the checkpoint and output folders"),
                Arg("overrides", "json", help="JSON object of training overrides"),
                Arg("window", "json", help="snapshots to train on (validate's window, JSON)"),
                Arg(
                    "force_retrain",
                    "bool",
                    help="train even if a version was trained on the same inputs",
                ),
            ),
            REGISTERED,
            "Train a candidate (the run's training Jobs as local processes) and register "
            "it, or reuse the version trained on the same inputs.",
        ),
        Step(
            "register",
            register,
            (
                _pipeline(),
                Arg("snapshot_id", required=True, help="the snapshot the run trained on"),
                Arg("run_id", required=True, help="the training run"),
                Arg("training", "json", help="the run's training config (JSON)"),
                Arg("seconds", "float", help="training wall-clock time"),
                Arg("attempts", "int", help="training attempts used"),
                Arg("fingerprint", "json", help="the training's inputs fingerprint (JSON)"),
                Arg("reused", "int", help="the version the run reused instead of training"),
                Arg("decision", help="why the run trained or reused, one sentence"),
            ),
            REGISTERED,
            "Register a finished training run's output as a numbered model version.",
        ),
        Step(
            "evaluate",
            evaluate,
            (
                _pipeline(),
                Arg("version", "int", required=True, help="the candidate version"),
                Arg("force_promote", "bool", help="promote even if the gate rejects"),
                Arg("force_reason", help="why (required with --force-promote true)"),
                Arg("actor", help="who asked"),
            ),
            ("promote", "verdict", "reason", "version", "champion", "metrics", "champion_metrics"),
            "Evaluate a candidate against the champion and the versions served before, and "
            "gate it.",
            # no TensorFlow up front: scores cached for the same version and holdout need none
        ),
        Step(
            "deploy",
            deploy,
            (
                _pipeline(),
                Arg("version", "int", required=True, help="the version to serve"),
                Arg("actor", help="who asked"),
            ),
            (
                "version",
                "previous",
                "url",
                "sample_prediction",
                "sample_key",
                "smoke_rows",
                "scorer",
            ),
            "Publish a gated version to serving, smoke-test it, make it the champion.",
        ),
        Step(
            "approval",
            approval,
            (
                _pipeline(),
                Arg("version", "int", required=True, help="the candidate asked about"),
                Arg("decision", required=True, help="pending, approved or rejected"),
                Arg("by", help="who answered"),
                Arg("reason", help="what they wrote"),
                Arg("run_id", help="the run that asked"),
            ),
            ("version", "decision", "by", "reason", "rolled_back", "served"),
            "Record the answer to a candidate's approval request (gate.approval: required).",
        ),
        Step(
            "summary",
            summary,
            (
                _pipeline(),
                Arg("run_id", help="the run: recorded with --results, else printed"),
                Arg("results", "json", help="each step's result keyed by step name (JSON)"),
            ),
            ("pipeline", "run_id", "finished_at"),
            "Record a run's results, or print the summary of the pipeline's last run.",
        ),
    )
}
"""Every step, in pipeline order."""

WORKER_HELP = "One training worker (the container of every training Job's pod)."


def deterministic(error: BaseException) -> bool:
    """Whether no retry can fix this failure (bad config or data, rejection, damage)."""
    from trainyard.errors import (
        ConfigError,
        DeployError,
        GateRejected,
        RegistryRefused,
        SourceInvalid,
        SourceMissing,
        SourceUnreadable,
        TrainingError,
        ValidationFailed,
    )

    if isinstance(error, TrainingError):
        return not getattr(error, "retryable", True)
    return isinstance(
        error,
        ConfigError
        | DaysFailed
        | ValidationFailed
        | GateRejected
        | RegistryRefused
        | SnapshotError
        | DeployError
        | SourceInvalid
        | SourceMissing
        | SourceUnreadable,
    )


def _emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    xcom = get_settings().xcom_path
    if xcom:
        atomic_write_json(xcom, result)


def _report_error(line: str) -> None:
    """The one-line error on stderr and in the pod's termination message."""
    sys.stderr.write(line + "\n")
    path = get_settings().termination_log
    if path:
        with contextlib.suppress(OSError):
            path.write_text(line[:4000] + "\n", encoding="utf-8")


def process_age() -> float:
    """Seconds since this process started, from the kernel's clock (Linux ``/proc``).

    ``psutil``'s start time adds whole seconds of boot time to it (``btime`` is rounded),
    which is the size of what is measured here; elsewhere it is what there is.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()


def start_up(libraries: Sequence[str] = ()) -> str:
    """How long this process took to get here, the named libraries imported first.

    Returns:
        E.g. ``3.42 s (python and trainyard 0.41 s, great_expectations 3.01 s)``: seconds
        since the process started (its start time as the OS recorded it), then the part
        each library's import took.
    """
    import importlib

    took = {}
    for name in libraries:
        t0 = time.perf_counter()
        importlib.import_module(name)
        took[name] = time.perf_counter() - t0
    age = process_age()
    parts = [f"python and trainyard {age - sum(took.values()):.2f} s"]
    parts += [f"{name} {seconds:.2f} s" for name, seconds in took.items()]
    return f"{age:.2f} s ({', '.join(parts)})"


def run_step(name: str, argv: list[str]) -> int:
    """``python -m trainyard <step> ...``: run one step from its command line.

    Prints the result as JSON and writes it to ``$TRAINYARD_XCOM_PATH`` when set (the way a
    KubernetesPodOperator pod returns XCom). A trainyard error prints one line (also to
    ``$TRAINYARD_TERMINATION_LOG``, the pod's termination message) and exits
    :data:`EXIT_DETERMINISTIC` or :data:`EXIT_FAILED`.

    Args:
        name: A key of :data:`STEPS`.
        argv: The arguments after the step name.

    Returns:
        The exit code.
    """
    step = STEPS[name]
    kwargs = step.parse(argv)
    log.info("%s: started after %s", name, start_up(step.libraries))
    try:
        result = step.fn(**kwargs)
    except StepSkipped as e:
        _report_error(f"trainyard {name}: skipped: {e}")
        return EXIT_SKIPPED
    except TrainyardError as e:
        _report_error(f"trainyard {name}: {type(e).__name__}: {e}")
        return EXIT_DETERMINISTIC if deterministic(e) else EXIT_FAILED
    except KeyboardInterrupt:
        _report_error(f"trainyard {name}: {INTERRUPTED}")
        return EXIT_INTERRUPTED
    if name == "summary" and kwargs.get("run_id") is None:
        from trainyard.serving.status import server_answer

        server = server_answer(str(result.get("pipeline") or kwargs["pipeline"]))
        sys.stdout.write(format_summary(result, server) + "\n" + since(result))
    else:
        _emit(result)
    return EXIT_OK
