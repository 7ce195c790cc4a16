"""The pipeline's steps, one function each, the same whether Airflow or a person runs them.

Every step takes plain arguments (pipeline name, ids, a dict of overrides) and returns a
JSON-serialisable dict, so it can be an Airflow task's return value (XCom), a pod's
``/airflow/xcom/return.json`` or a CLI command's output. The stage modules do the work;
this module only resolves configs and paths and hands results from one stage to the next::

    stage ─▶ validate ─▶ train (+ register) ─▶ evaluate (gate) ─▶ deploy (+ promote) ─▶ summary
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.config import PipelineConfig, TrainingConfig, load_pipeline
from trainyard.errors import RegistryError, SnapshotError
from trainyard.fsutil import atomic_write_json, read_json
from trainyard.settings import get_settings

log = logging.getLogger("trainyard.steps")

TRAINING_OVERRIDES = ("epochs", "workers", "strategy", "priority", "batch_size", "learning_rate")


def _registry(cfg: PipelineConfig) -> Any:
    from trainyard.registry import Registry

    return Registry(get_settings().models_root, cfg.name)


def _snapshot_path(cfg: PipelineConfig, snapshot_id: str) -> Path:
    from trainyard import volumes

    path = volumes.snapshot_dir(cfg.dataset, snapshot_id)
    if not (path / "manifest.json").is_file():
        raise SnapshotError(
            f"snapshot {snapshot_id!r} of dataset {cfg.dataset!r} not found at {path}"
        )
    return path


def training_params(cfg: PipelineConfig, overrides: dict[str, Any] | None) -> TrainingConfig:
    """The pipeline's training config with trigger-form overrides applied (and re-validated).

    Args:
        cfg: The pipeline config.
        overrides: Values from the trigger form; ``None`` values are ignored.

    Returns:
        The effective training config.
    """
    values = {
        k: v for k, v in (overrides or {}).items() if k in TRAINING_OVERRIDES and v is not None
    }
    return TrainingConfig.model_validate({**cfg.training.model_dump(), **values})


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
        and ``given`` (True when ``snapshot_id`` was passed in).
    """
    from trainyard.staging import stage as stage_source

    cfg = load_pipeline(pipeline)
    if snapshot_id:
        path = _snapshot_path(cfg, snapshot_id)
        return {
            "snapshot_id": snapshot_id,
            "dataset": cfg.dataset,
            "path": str(path),
            "reused": True,
            "given": True,
        }
    result = stage_source(cfg, interval_start, interval_end)
    out = {
        "snapshot_id": result.snapshot_id,
        "dataset": result.dataset,
        "path": str(result.path),
        "reused": result.reused,
        "rows": result.rows,
        "bytes": result.bytes,
        "shards": result.shards,
        "seconds": round(result.seconds, 3),
        "interval": [interval_start, interval_end],
        "given": False,
    }
    log.info(
        "staged %s snapshot %s (%s rows, reused=%s)",
        cfg.dataset,
        result.snapshot_id,
        result.rows,
        result.reused,
    )
    return out


def validate(pipeline: str, snapshot_id: str) -> dict[str, Any]:
    """Validate a snapshot against its dataset's contract; raises ``ValidationFailed``.

    Args:
        pipeline: Pipeline name.
        snapshot_id: The snapshot to check.

    Returns:
        ``success``, ``snapshot_id``, ``report_dir``, ``warnings``.
    """
    from trainyard.validation import validate as run_validation

    cfg = load_pipeline(pipeline)
    result = run_validation(cfg, snapshot_id)
    log.info("validation of %s:\n%s", snapshot_id, result.table)
    return {
        "success": result.success,
        "snapshot_id": result.snapshot_id,
        "report_dir": str(result.report_dir),
        "warnings": len(result.warnings),
    }


def train(
    pipeline: str,
    snapshot_id: str,
    run_id: str,
    overrides: dict[str, Any] | None = None,
    log_line: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train a candidate with local worker processes, then register it as a new version.

    Args:
        pipeline: Pipeline name.
        snapshot_id: Validated snapshot to train on.
        run_id: Airflow run id (names checkpoints and the work dir).
        overrides: Trigger-form overrides of the training config.
        log_line: Where worker log lines go (the task log); defaults to logging.

    Returns:
        ``version`` (the registered candidate), ``metrics``, ``attempts``, ``seconds``.
    """
    from trainyard.training import run_training

    cfg = load_pipeline(pipeline)
    params = training_params(cfg, overrides)
    snapshot = _snapshot_path(cfg, snapshot_id)
    work = get_settings().models_root / cfg.name / ".work" / _safe(run_id)
    result = run_training(cfg, snapshot, work, params, run_id=run_id, log=log_line)
    return register(
        pipeline,
        snapshot_id,
        run_id,
        str(work),
        params.model_dump(),
        result.seconds,
        result.attempts,
    )


def register(
    pipeline: str,
    snapshot_id: str,
    run_id: str,
    output_dir: str,
    params: dict[str, Any],
    seconds: float | None = None,
    attempts: int | None = None,
) -> dict[str, Any]:
    """Register a finished training output (``<output_dir>/model``) as a numbered version.

    On Kubernetes the training Job writes ``output_dir`` on the models volume and this step
    runs as its own pod; locally ``train`` calls it directly.

    Returns:
        ``version``, ``metrics``, ``attempts``, ``seconds``.
    """
    import shutil

    from trainyard import __version__
    from trainyard.contracts import load_contract

    cfg = load_pipeline(pipeline)
    out = Path(output_dir)
    model_dir = out / "model"
    if not (model_dir / "saved_model.pb").is_file():
        raise RegistryError(f"training output {model_dir} holds no SavedModel")
    metrics = read_json(out / "metrics.json") if (out / "metrics.json").is_file() else {}
    metadata = {
        "pipeline": cfg.name,
        "dataset": cfg.dataset,
        "snapshot_id": snapshot_id,
        "contract_version": load_contract(cfg.dataset).version,
        "config_hash": cfg.config_hash(),
        "code_version": _code_version(__version__),
        "image": os.environ.get("TRAINYARD_IMAGE", "local"),
        "run_id": run_id,
        "training": params,
        "train_metrics": metrics,
        "timings": {"train_seconds": seconds, "attempts": attempts},
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
    }
    extra = [p for p in (out / "metrics.json", out / "history.json") if p.is_file()]
    version = _registry(cfg).register(model_dir, metadata, extra_files=extra)
    shutil.rmtree(out, ignore_errors=True)
    log.info("registered %s version %d (trained on snapshot %s)", cfg.name, version, snapshot_id)
    return {"version": version, "metrics": metrics, "attempts": attempts, "seconds": seconds}


def evaluate(
    pipeline: str,
    version: int,
    force_promote: bool = False,
    force_reason: str | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Evaluate the candidate and the champion on the same holdout split, and gate.

    The decision report is written next to the candidate (``gate.md`` / ``gate.json``).

    Returns:
        ``promote``, ``verdict``, ``reason``, ``version``, ``champion``, ``metrics``,
        ``champion_metrics``, ``report`` (markdown).
    """
    from trainyard import evaluation

    cfg = load_pipeline(pipeline)
    registry = _registry(cfg)
    force = None
    if force_promote:
        force = evaluation.ForceRequest(
            actor=actor or "unknown",
            reason=force_reason or "",
            at=dt.datetime.now(dt.UTC).isoformat(),
        )
    decision = evaluation.evaluate_and_decide(cfg, registry, int(version), force)
    log.info("gate decision for %s v%s:\n%s", cfg.name, version, decision.to_markdown())
    return decision.summary()


def deploy(pipeline: str, version: int, actor: str | None = None) -> dict[str, Any]:
    """Publish a gated version to serving, smoke-test it, and make it the champion.

    On a failed smoke test serving rolls back to the previous champion and ``DeployError``
    is raised; the champion pointer only moves after the new version answered correctly.

    Returns:
        ``version``, ``url``, ``sample_prediction``, ``smoke_rows``, ``previous``.
    """
    from trainyard import evaluation
    from trainyard.contracts import feature_spec, load_contract
    from trainyard.serving.deploy import deploy as deploy_version
    from trainyard.serving.deploy import ensure_local_server

    cfg = load_pipeline(pipeline)
    settings = get_settings()
    registry = _registry(cfg)
    version = int(version)
    meta = registry.metadata(version)
    contract = load_contract(cfg.dataset)
    smoke = evaluation.smoke_examples(cfg, registry, version, cfg.serving.smoke_rows)
    previous = registry.champion()
    # On a cluster the deploy pod reaches TF Serving through its Service; locally the
    # step starts the server itself when nothing answers on the port.
    host = os.environ.get("TRAINYARD_SERVING_HOST") or cfg.serving.host
    if host == cfg.serving.host:
        ensure_local_server(settings.serving_root, host, cfg.serving.port)
    result = deploy_version(
        model_name=cfg.serving.model_name,
        version=version,
        model_dir=registry.version_dir(version) / "model",
        serving_root=settings.serving_root,
        host=host,
        port=cfg.serving.port,
        smoke_inputs=smoke.features,
        expected_class_ids=smoke.expected_class_ids,
        feature_spec=feature_spec(contract),
        previous_version=previous,
        timeout_s=120.0,
    )
    registry.promote(
        version,
        reason=f"deployed after gate on snapshot {meta['snapshot_id']}",
        actor=actor or "pipeline",
    )
    return {
        "version": version,
        "previous": previous,
        "url": result.url,
        "sample_prediction": result.sample_prediction,
        "sample_key": smoke.keys[0] if len(smoke.keys) else None,
        "smoke_rows": result.smoke_rows,
    }


def summary(pipeline: str, run_id: str, results: dict[str, Any]) -> dict[str, Any]:
    """Record a run's results (``runs/<run_id>.json``, ``last_run.json``) and return them.

    Args:
        pipeline: Pipeline name.
        run_id: The run.
        results: Each step's return value keyed by step name (missing when skipped).

    Returns:
        The summary that was written.
    """
    cfg = load_pipeline(pipeline)
    record = {
        "pipeline": cfg.name,
        "run_id": run_id,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        **results,
    }
    runs = get_settings().models_root / cfg.name / "runs"
    atomic_write_json(runs / f"{_safe(run_id)}.json", record)
    atomic_write_json(runs.parent / "last_run.json", record)
    return record


def format_summary(record: dict[str, Any]) -> str:
    """Render a run record as the few lines a person wants to read."""
    stage_r, val, tr = (
        record.get("stage") or {},
        record.get("validate") or {},
        record.get("train") or {},
    )
    gate, dep = record.get("evaluate") or {}, record.get("deploy") or {}
    lines = [
        f"pipeline      {record.get('pipeline')}   run {record.get('run_id')}",
        f"snapshot      {stage_r.get('snapshot_id', '-')}"
        + (" (reused: unchanged data)" if stage_r.get("reused") else " (new)" if stage_r else ""),
        f"validation    {'passed' if val.get('success') else 'not run' if not val else 'failed'}"
        + (f", {val.get('warnings')} warnings" if val.get("warnings") else ""),
        f"training      version {tr.get('version', '-')}, attempts {tr.get('attempts', '-')}, "
        f"{_fmt_seconds(tr.get('seconds'))}",
        f"metrics       {_fmt_metrics(gate.get('metrics') or {})}",
        f"champion      {_fmt_metrics(gate.get('champion_metrics') or {}) or 'none (first run)'}",
        f"gate          {gate.get('verdict', 'not run')}: {gate.get('reason', '-')}",
    ]
    if dep:
        lines.append(f"served        version {dep.get('version')} at {dep.get('url')}")
        lines.append(f"prediction    {_fmt_prediction(dep)}")
    else:
        lines.append("served        unchanged (nothing deployed)")
    return "\n".join(lines)


def _fmt_prediction(deployed: dict[str, Any]) -> str:
    pred = deployed.get("sample_prediction") or {}
    probs = pred.get("probabilities")
    text = f"class {pred.get('class_id')}"
    if isinstance(probs, list) and probs:
        text += f" (p={max(probs):.3f})"
    if deployed.get("sample_key"):
        text += f" for holdout sample {deployed['sample_key']!r}"
    return f"{text}, over HTTP; {deployed.get('smoke_rows')} smoke rows matched offline evaluation"


def _fmt_metrics(metrics: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted(metrics.items())
        if "@" not in k
    )


def _fmt_seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, int | float) else "-"


def _safe(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:120]


def _code_version(package_version: str) -> str:
    head = get_settings().project_dir / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            ref = (head.parent / ref[5:]).read_text().strip()
        return f"{package_version}+g{ref[:12]}"
    except OSError:
        return package_version


def run_all(pipeline: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every step in this process, in order, without Airflow (``trainyard run``).

    Args:
        pipeline: Pipeline name.
        overrides: Training overrides and ``force_promote`` / ``force_reason``.

    Returns:
        The run summary.
    """
    overrides = overrides or {}
    run_id = "cli__" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    today = dt.date.today().isoformat()
    results: dict[str, Any] = {}
    results["stage"] = stage(pipeline, today, today)
    snap = results["stage"]["snapshot_id"]
    results["validate"] = validate(pipeline, snap)
    results["train"] = train(pipeline, snap, run_id, overrides)
    version = results["train"]["version"]
    results["evaluate"] = evaluate(
        pipeline,
        version,
        bool(overrides.get("force_promote")),
        overrides.get("force_reason"),
        "cli",
    )
    if results["evaluate"]["promote"]:
        results["deploy"] = deploy(pipeline, version, "cli")
    return summary(pipeline, run_id, results)


def _emit(result: dict[str, Any]) -> None:
    text = json.dumps(result, indent=2, default=str)
    sys.stdout.write(text + "\n")
    xcom = os.environ.get("TRAINYARD_XCOM_PATH")
    if xcom:
        atomic_write_json(Path(xcom), result)


def cli_main(argv: list[str]) -> int:
    """``python -m trainyard stage|validate|train|register|evaluate|deploy|run|summary``.

    Each prints its result as JSON (and writes it to ``$TRAINYARD_XCOM_PATH`` when set, the
    way a KubernetesPodOperator pod returns XCom).
    """
    parser = argparse.ArgumentParser(prog="python -m trainyard")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stage", help=stage.__doc__)
    p.add_argument("--pipeline", required=True)
    p.add_argument("--interval-start")
    p.add_argument("--interval-end")
    p.add_argument("--snapshot-id", help="use this existing snapshot instead of staging")
    p = sub.add_parser("validate")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--snapshot", required=True)
    p = sub.add_parser("train")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--snapshot", required=True)
    p.add_argument("--run-id", default=None)
    p.add_argument("--overrides", default="{}", help="JSON object of training overrides")
    p = sub.add_parser("register")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--snapshot", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--overrides", default="{}")
    p = sub.add_parser("evaluate")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--force-promote", choices=["true", "false"], default="false")
    p.add_argument("--force-reason")
    p.add_argument("--actor")
    p = sub.add_parser("deploy")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--version", type=int, required=True)
    p = sub.add_parser("run", help="every step in this process, without Airflow")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--overrides", default="{}")
    p = sub.add_parser("summary", help="print the last run's summary")
    p.add_argument("--pipeline", required=True)
    args = parser.parse_args(argv)

    if args.command == "stage":
        _emit(
            stage(args.pipeline, args.interval_start, args.interval_end, args.snapshot_id or None)
        )
    elif args.command == "validate":
        _emit(validate(args.pipeline, args.snapshot))
    elif args.command == "train":
        run_id = args.run_id or "cli__" + str(int(time.time()))
        _emit(train(args.pipeline, args.snapshot, run_id, json.loads(args.overrides)))
    elif args.command == "register":
        cfg = load_pipeline(args.pipeline)
        params = training_params(cfg, json.loads(args.overrides)).model_dump()
        _emit(register(args.pipeline, args.snapshot, args.run_id, args.output_dir, params))
    elif args.command == "evaluate":
        force = args.force_promote == "true"
        _emit(evaluate(args.pipeline, args.version, force, args.force_reason or None, args.actor))
    elif args.command == "deploy":
        _emit(deploy(args.pipeline, args.version))
    elif args.command == "run":
        record = run_all(args.pipeline, json.loads(args.overrides))
        sys.stdout.write(format_summary(record) + "\n")
    elif args.command == "summary":
        cfg = load_pipeline(args.pipeline)
        path = get_settings().models_root / cfg.name / "last_run.json"
        if not path.is_file():
            sys.stderr.write(f"no run of pipeline {cfg.name!r} recorded yet ({path})\n")
            return 1
        sys.stdout.write(format_summary(read_json(path)) + "\n")
    return 0
