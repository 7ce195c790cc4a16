"""A run's record as the few lines a person reads (``make run``, ``trainyard run``, ``summary``).

The record is what the ``summary`` step writes (``runs/<run>.json``): each step's result by
name. The UI's pages draw the same record (:mod:`trainyard.runview`).
"""

from __future__ import annotations

from typing import Any

from trainyard.config import load_pipeline
from trainyard.errors import TrainyardError
from trainyard.registry import Registry, format_metrics
from trainyard.settings import get_settings


def _registry(pipeline: Any) -> Registry:
    return Registry(get_settings().models_root, pipeline.name)


def record_failure(pipeline: str, run_id: str, step: str, reason: str) -> None:
    """Write why a run's step failed, for its page, note and summary (never raises).

    A step that failed returns no result to show (:meth:`Layout.run_failure`).
    """
    import datetime as dt
    import logging

    from trainyard.fsutil import atomic_write_json
    from trainyard.layout import Layout

    path = Layout(get_settings().volume_root).run_failure(pipeline, run_id)
    doc = {"step": step, "reason": reason[:1000], "at": dt.datetime.now(dt.UTC).isoformat()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, doc)
    except OSError as e:  # the run still fails with its reason; only the page lacks it
        logging.getLogger("trainyard.runs").warning(
            "cannot record why %s failed in %s: %s", step, path, e
        )


def since(record: dict[str, Any]) -> str:
    """A line when the champion is no longer what the last recorded run left (or "")."""
    try:
        champion = _registry(load_pipeline(str(record.get("pipeline")))).champion()
    except TrainyardError:
        return ""
    served = (record.get("deploy") or {}).get("version")
    left = served if served is not None else (record.get("evaluate") or {}).get("champion")
    if champion == left:
        return ""
    now = "none" if champion is None else f"version {champion}"
    return f"now           the champion is {now} (python -m trainyard models history)\n"


def format_summary(record: dict[str, Any], server: dict[str, Any] | None = None) -> str:
    """Render a run record as the few lines a person wants to read.

    Args:
        record: The run's record (each step's result by name).
        server: What the model server answers now
            (:func:`trainyard.serving.status.server_answer`); None: not asked (a cluster),
            the ``served`` line says what the run left.
    """
    from trainyard.volumes.window import seen_text

    stage_r, val = record.get("stage") or {}, record.get("validate") or {}
    tr = {**(record.get("train") or {}), **(record.get("register") or {})}
    gate, dep = record.get("evaluate") or {}, record.get("deploy") or {}
    finished = f" (finished {record['finished_at'][:19]})" if record.get("finished_at") else ""
    lines = [
        f"pipeline      {record.get('pipeline')}   run {record.get('run_id')}{finished}",
        f"snapshot      {stage_r.get('snapshot_id', '-')}" + _fmt_staged(stage_r),
        f"validation    {'passed' if val.get('success') else 'not run' if not val else 'failed'}"
        + (f", {val.get('warnings')} warnings" if val.get("warnings") else ""),
        f"training      {_fmt_training(tr)}"
        if tr
        else f"training      not run: {_why_not_trained(record)}",
    ]
    seen = seen_text(tr.get("window") or val.get("window") or [], tr.get("rows")) if tr else ""
    if seen:
        lines.append(f"data          trained on {seen}")
    lines += [
        f"metrics       {format_metrics(gate.get('metrics') or {})}",
        f"champion      {_champion_text(gate)}",
        f"gate          {gate.get('verdict', 'not run')}: {gate.get('reason', '-')}"
        if gate
        else f"gate          not run: {_why_not_evaluated(record)}",
    ]
    if val.get("lacks"):
        lines.append(
            f"lacks         {', '.join(d[:10] for d in val['lacks'])}: the window's snapshots of "
            "these intervals are gone (training.window_gaps: train)"
        )
    answer = record.get("approve")
    if isinstance(answer, dict):
        if answer.get("approved") is None:
            lines.append("approval      waiting for a person (gate.approval: required)")
        else:
            said = "approved" if answer.get("approved") else "rejected"
            why = answer.get("reason") or "(no reason)"
            lines.append(f"approval      {said} by {answer.get('by')}: {why}")
    if record.get("skipped"):
        days = record["skipped"]
        lines.append(f"skipped       {', '.join(days)}: nothing to stage (source.when_missing)")
    if record.get("failed_days"):
        days = list(record["failed_days"])
        lines.append(
            f"failed        {', '.join(days)}: their data (the range went on without them"
            + _fmt_failed_in_window(days, tr.get("window") or val.get("window") if tr else None)
            + ")"
        )
    lines.append(f"served        {_fmt_served(record, server)}")
    if dep:
        lines.append(f"prediction    {_fmt_prediction(dep)}")
        if dep.get("scorer"):
            lines.append(f"stream        {dep['scorer']}")
    return "\n".join(lines)


def _fmt_training(tr: dict[str, Any]) -> str:
    """The training line: what trained (or was reused), how long, and why."""
    if tr.get("reused") and tr.get("decision"):
        return str(tr["decision"])
    line = (
        f"version {tr.get('version', '-')}, attempts {tr.get('attempts', '-')}, "
        f"{_fmt_seconds(tr.get('seconds'))}"
    )
    why = tr.get("decision")
    return f"{line} ({why})" if why else line


def _fmt_served(record: dict[str, Any], server: dict[str, Any] | None) -> str:
    """What serves now, as the model server answers; what the run left when not asked."""
    dep = record.get("deploy") or {}
    run = "deployed by this run" if dep else "this run deployed nothing"
    if server is None:
        if dep:
            return f"version {dep.get('version')} at {dep.get('url')} ({run})"
        champion = (record.get("evaluate") or {}).get("champion")
        left = f"version {champion}" if champion is not None else "nothing"
        return f"unchanged ({run}; the registry's champion: {left}; the server was not asked)"
    address = server.get("address")
    if server.get("error"):
        return (
            f"nothing: no model server answers at {address} ({server['error']}); "
            f"{run} (python -m trainyard models serve --pipeline {record.get('pipeline')})"
        )
    versions = server.get("versions") or []
    if not versions:
        return f"nothing: the server at {address} has no version of the model available ({run})"
    shown = ", ".join(f"version {v}" for v in versions)
    return f"{shown} at {address}, as the server answers now ({run})"


def _fmt_failed_in_window(days: list[str], window: Any) -> str:
    """Whether a training window holds failed days (their earlier snapshots) or not."""
    entries = [e for e in window or [] if isinstance(e, dict)]
    if len(entries) < 2:
        return ""
    trained = {str(e["interval"][0])[:10] for e in entries if e.get("interval")}
    kept = [d for d in days if d in trained]
    if kept:
        return f"; trained on the earlier snapshot of {', '.join(kept)}"
    return "; the training window left them out"


def _fmt_staged(staged: dict[str, Any]) -> str:
    """How the snapshot came about, in the words of what staging checked."""
    if not staged:
        return ""
    state = "reused" if staged.get("reused") else "new"
    if staged.get("replaced"):
        state += f", replaces {staged['replaced']} for this interval"
    checked = staged.get("checked")
    return f" ({state}: {checked})" if checked else f" ({state})"


def _why_not_trained(record: dict[str, Any]) -> str:
    """Why a run's record has no trained version."""
    if (record.get("validate") or {}).get("success"):
        return "this run did not train (backfill_training, or a dry run)"
    return "its snapshot did not pass validation" if record.get("validate") else "nothing to train"


def _why_not_evaluated(record: dict[str, Any]) -> str:
    """Why a run's record has no gate decision."""
    if record.get("train") or record.get("register"):
        return "the run stopped before the gate"
    if (record.get("validate") or {}).get("success"):
        return "this run did not train (backfill_training, or a dry run)"
    return "nothing to evaluate"


def _champion_text(gate: dict[str, Any]) -> str:
    if not gate:  # the run did not train (a backfill's earlier day, a dry run, a failure)
        return "not compared (this run evaluated nothing)"
    if gate.get("verdict") == "keep":
        return f"version {gate.get('champion')}: this run's candidate (reused), kept"
    metrics = format_metrics(gate.get("champion_metrics") or {})
    if metrics:
        return metrics
    if gate.get("champion") is not None and gate.get("champion") != gate.get("version"):
        return f"v{gate['champion']} (not compared)"
    return "none (first run)"


def _fmt_prediction(deployed: dict[str, Any]) -> str:
    pred = deployed.get("sample_prediction") or {}
    probs = pred.get("probabilities")
    if "predictions" in pred and "class_id" not in pred:
        text = f"value {pred['predictions']:.4g}"
    else:
        name = pred.get("class_name")
        text = f"class {pred.get('class_id')}" + (
            f" {name!r}" if name not in (None, str(pred.get("class_id"))) else ""
        )
    if isinstance(probs, list) and probs:
        text += f" (p={max(probs):.3f})"
    if deployed.get("sample_key"):
        text += f" for holdout sample {deployed['sample_key']!r}"
    return f"{text}, over HTTP; {deployed.get('smoke_rows')} smoke rows matched offline evaluation"


def _fmt_seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, int | float) else "-"
