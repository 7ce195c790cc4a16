"""What a run and a pipeline did, read from the volume and rendered as HTML for the Airflow UI.

The Airflow UI plugin (``trainyard.orchestration.ui``) serves these pages; this module
knows nothing of Airflow or HTTP. Everything is read from where the steps wrote it:

* the run record ``_models/<pipeline>/runs/<run>.json`` (the summary step), else the
  version registered by the run (``metadata.json``'s ``run_id``);
* the snapshot's ``manifest.json`` and ``validation/summary.json`` (+ Data Docs);
* the version's ``metrics.json``, ``history.json`` (per-epoch curves) and ``gate.json``;
* the registry's ``champion.json`` and ``history.jsonl`` (promotions and rollbacks).

Pages are server-rendered HTML with inline SVG charts (no script, no external asset), so
they render inside the UI's sandboxed iframe. This module gathers what a page shows and
draws the charts; the Jinja2 templates in ``templates/`` lay the pages out, autoescaped:
every value from a file is escaped.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from trainyard.errors import ConfigError, RegistryError, TrainyardError
from trainyard.layout import Layout, safe_name
from trainyard.registry import format_metrics

DAG_PREFIX = "trainyard_"
NOTE_MAX = 1000
"""Airflow keeps at most 1,000 characters of a run's note."""


class NotFound(TrainyardError):
    """The pipeline, run or file asked for does not exist (or is not trainyard's)."""


def pipeline_of(dag_id: str) -> str:
    """The pipeline name of a trainyard DAG id (``trainyard_<pipeline>``).

    Args:
        dag_id: The DAG id.

    Returns:
        The pipeline name.

    Raises:
        NotFound: If the DAG is not a trainyard pipeline's or the name is not safe.
    """
    if not dag_id.startswith(DAG_PREFIX):
        raise NotFound(f"{dag_id!r} is not a trainyard pipeline (its DAG id starts otherwise)")
    try:
        return safe_name("pipeline", dag_id[len(DAG_PREFIX) :])
    except ConfigError as e:
        raise NotFound(str(e)) from e


def _read(path: Path) -> Any:
    """JSON from ``path``, or None if it is absent or unreadable (pages show what exists)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _dataset_of(pipeline: str, versions: Sequence[Mapping[str, Any]]) -> str | None:
    for meta in versions:
        if meta.get("dataset"):
            return str(meta["dataset"])
    try:
        from trainyard.config import load_pipeline

        return load_pipeline(pipeline).dataset
    except ConfigError:
        return None


def _versions(root: Path, pipeline: str) -> list[dict[str, Any]]:
    """Every readable version of a pipeline with its metrics and gate, oldest first."""
    from trainyard.registry import Registry, readable_versions

    reg = Registry(Layout(root).models_root, pipeline)
    good, _ = readable_versions(reg)
    out = []
    for number, meta in good:
        vdir = reg.versions_root / str(number)
        gate = _read(vdir / "gate.json") or {}
        out.append(
            {
                **meta,
                "version": number,
                "metrics": _read(vdir / "metrics.json") or meta.get("train_metrics") or {},
                "gate": gate,
                "curves": _read(vdir / "history.json") or {},
            }
        )
    return out


def _registry_state(root: Path, pipeline: str) -> tuple[dict[str, Any] | None, list[dict]]:
    from trainyard.registry import Registry

    reg = Registry(Layout(root).models_root, pipeline)
    try:
        champion = reg.champion_state()
    except RegistryError:
        champion = None
    try:
        history = reg.history()
    except RegistryError:
        history = []
    return champion, history


def snapshot_info(root: Path, dataset: str, snapshot_id: str) -> dict[str, Any]:
    """A snapshot's manifest facts and validation verdict.

    Args:
        root: The volume root.
        dataset: The dataset.
        snapshot_id: The snapshot.

    Returns:
        ``id``, ``rows``, ``shards``, ``bytes``, ``interval``, ``validation`` (the
        summary, or None) and ``data_docs`` (whether the Data Docs page exists).
    """
    snap = Layout(root).snapshot(dataset, snapshot_id)
    manifest = _read(snap / "manifest.json") or {}
    shards = [s for s in manifest.get("shards") or [] if s.get("role", "data") == "data"]
    return {
        "id": snapshot_id,
        "dataset": dataset,
        "exists": snap.is_dir(),
        "rows": manifest.get("rows"),
        "bytes": manifest.get("bytes"),
        "shards": len(shards),
        "interval": manifest.get("interval"),
        "created_at": manifest.get("created_at"),
        "validation": _read(snap / "validation" / "summary.json"),
        "rejected": (snap / "validation" / "rejected.json").is_file(),
        "data_docs": (snap / "validation" / "data_docs" / "index.html").is_file(),
    }


def run_story(
    root: Path, pipeline: str, run_id: str, results: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Everything one run did, from the files its steps wrote.

    Args:
        root: The volume root.
        pipeline: The pipeline.
        run_id: The Airflow run id.
        results: The steps' results so far (their XComs), used while the run has no
            record: a run still going, or one that stopped before its summary (e.g. a
            snapshot validation rejected).

    Returns:
        ``record`` (the summary step's record, else the results so far, or None),
        ``summarised`` (whether the summary wrote the record), ``snapshot``, ``version``
        (its metadata, metrics, curves and gate), ``gate``, ``deploy``, ``champion``,
        ``history``.

    Raises:
        NotFound: If there is no record, no result and no version of this run.
    """
    layout = Layout(root)
    try:
        record = _read(layout.run_record(pipeline, run_id))
    except ConfigError as e:
        raise NotFound(str(e)) from e
    summarised = record is not None
    if record is None and results:
        record = {"pipeline": pipeline, "run_id": run_id, **results}
    if record is not None:
        record = {k: v for k, v in record.items() if k != "approve"}
        answer = approval_of(root, pipeline, record)
        if answer is not None:
            record["approve"] = answer
    versions = _versions(root, pipeline)
    reg_version = ((record or {}).get("register") or {}).get("version")
    mine = [
        v
        for v in versions
        if v["version"] == reg_version or (reg_version is None and v.get("run_id") == run_id)
    ]
    version = mine[-1] if mine else None
    if record is None and version is None:
        _ensure_pipeline(root, pipeline)
        raise NotFound(
            f"pipeline {pipeline!r} has no record of run {run_id!r}: no such run, or none "
            "of its steps has returned a result"
        )
    staged = (record or {}).get("stage") or {}
    snapshot_id = staged.get("snapshot_id") or (version or {}).get("snapshot_id")
    dataset = _dataset_of(pipeline, versions)
    snapshot = None
    if snapshot_id and dataset:
        try:
            snapshot = snapshot_info(root, dataset, snapshot_id)
        except ConfigError:
            snapshot = None
    if snapshot is not None:
        snapshot["reused"] = staged.get("reused")
        snapshot["checked"] = staged.get("checked")
    champion, history = _registry_state(root, pipeline)
    evaluate = (record or {}).get("evaluate") or {}
    gate = dict((version or {}).get("gate") or {})
    for key in ("verdict", "reason", "promote"):
        if key in evaluate and key not in gate:
            gate[key] = evaluate[key]
    return {
        "pipeline": pipeline,
        "run_id": run_id,
        "record": record,
        "summarised": summarised,
        "snapshot": snapshot,
        "version": version,
        "gate": gate or None,
        "deploy": (record or {}).get("deploy"),
        "champion": champion,
        "history": history,
    }


def approval_of(root: Path, pipeline: str, results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer the registry holds for the run's candidate, as a run record shows it.

    Never an XCom: the registry's ``approval.json`` is written only from the answer Airflow
    recorded (:func:`trainyard.steps.approval`).

    Returns:
        ``approved`` (None: waiting), ``by``, ``reason``, ``at``; None when the candidate
        was never asked about.
    """
    from trainyard.registry import Registry

    version = (results.get("register") or {}).get("version")
    if version is None:
        return None
    reg = Registry(Layout(root).models_root, pipeline)
    try:
        if reg.read_file(int(version), "approval.json") is None:
            return None
        return reg.approval_answer(int(version))
    except (RegistryError, ValueError):
        return None


def _ensure_pipeline(root: Path, pipeline: str) -> None:
    """Refuse a pipeline with no registry folder and no config (no server path named)."""
    if Layout(root).models(pipeline).is_dir():
        return
    from trainyard.config import load_pipeline

    try:
        load_pipeline(pipeline)
    except ConfigError:
        raise NotFound(f"unknown pipeline {pipeline!r}") from None


def run_failure(root: Path, pipeline: str, run_id: str, failed: Sequence[str]) -> str | None:
    """Why the run's failed step failed, as its task recorded it.

    None if none of ``failed`` recorded a reason (or the run has no failed task).
    """
    try:
        doc = _read(Layout(root).run_failure(pipeline, run_id))
    except ConfigError:
        return None
    if not isinstance(doc, dict) or doc.get("step") not in failed:
        return None
    return str(doc.get("reason") or "") or None


def render_unrecorded(
    pipeline: str, run_id: str, state: str, failed: Sequence[str], reason: str | None = None
) -> str:
    """The page of a run Airflow knows that recorded nothing.

    It failed before any step returned a result, or has not got that far.
    """
    return _render(
        "unrecorded.html.j2",
        pipeline=pipeline,
        run_id=run_id,
        state=state,
        failed=list(failed),
        reason=reason,
    )


def render_not_found(message: str) -> str:
    """The page of something the plugin does not know (the API answers JSON instead)."""
    return _render("not_found.html.j2", message=message)


def pipeline_story(root: Path, pipeline: str) -> dict[str, Any]:
    """A pipeline's versions over time, their snapshots, the champion and the history.

    Args:
        root: The volume root.
        pipeline: The pipeline.

    Returns:
        ``versions`` (oldest first), ``champion`` and ``history``.

    Raises:
        NotFound: If the pipeline has no registry folder and no config.
    """
    versions = _versions(root, pipeline)
    if not versions:
        _ensure_pipeline(root, pipeline)
    champion, history = _registry_state(root, pipeline)
    return {"pipeline": pipeline, "versions": versions, "champion": champion, "history": history}


# --------------------------------------------------------------------------- the run note


def summary_line(
    results: Mapping[str, Any],
    failed: Sequence[str] = (),
    dry_run: bool = False,
    reason: str | None = None,
) -> str:
    """The run's one-line summary (a run note): snapshot, metrics, decision, served version.

    Args:
        results: Each step's result keyed by step name (``stage``, ``validate``,
            ``register``, ``evaluate``, ``approve``, ``deploy``), as in the run record.
        failed: The run's failed tasks (a failed step returns no result).
        dry_run: The run was a dry run (the form's): it stopped before training.
        reason: Why the failed step failed (:func:`run_failure`).

    Returns:
        One line, at most :data:`NOTE_MAX` characters.
    """
    stage, val = results.get("stage") or {}, results.get("validate") or {}
    reg, ev, dep = (
        results.get("register") or {},
        results.get("evaluate") or {},
        results.get("deploy"),
    )
    parts = []
    if stage:
        state = "reused" if stage.get("reused") else "new"
        rows = f", {stage['rows']} rows" if stage.get("rows") is not None else ""
        parts.append(f"snapshot {stage.get('snapshot_id')} ({state}{rows})")
    val_failed = (val and not val.get("success")) or "validate" in failed
    parts.append(
        "validation " + ("passed" if val.get("success") else "failed" if val_failed else "not run")
    )
    if reg.get("version") is not None:
        from trainyard.volumes.window import seen_text

        metrics = format_metrics(ev.get("metrics"), limit=3)
        reused = " reused (same inputs)" if reg.get("reused") else ""
        parts.append(f"v{reg['version']}{reused}" + (f" {metrics}" if metrics else ""))
        seen = seen_text(reg.get("window") or val.get("window") or [], reg.get("rows"))
        if seen:
            parts.append(f"trained on {seen}")
    if dry_run and not reg and not failed:
        parts.append("dry run: stopped before training (its plan is in the train task's log)")
    elif dry_run and not reg:
        parts.append("dry run")
    elif ev:
        parts.append(f"gate {ev.get('verdict', '?')}: {ev.get('reason', '')}".rstrip(": "))
    else:
        parts.append("gate not run")
    answer = results.get("approve")
    if isinstance(answer, dict):
        said = "approved" if answer.get("approved") else "rejected"
        parts.append(
            f"{said} by {answer.get('by')}"
            + (f": {answer['reason']}" if answer.get("reason") else "")
        )
    if dep and dep.get("version") is not None:
        parts.append(f"serving v{dep['version']}")
    else:
        champion = ev.get("champion", ev.get("champion_version"))
        parts.append(f"serving unchanged (v{champion})" if champion else "serving unchanged")
    if failed:
        # killed, marked failed by a person, or stopped before trainyard's code ran
        why = reason or "no reason recorded: see the task's log"
        parts.append("failed: " + ", ".join(failed) + f" ({why})")
    line = " · ".join(parts).replace("\n", " ")
    return line if len(line) <= NOTE_MAX else line[: NOTE_MAX - 1] + "…"


# --------------------------------------------------------------------------- SVG charts

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    x_label: str = "",
    marks: Mapping[float, str] | None = None,
    width: int = 420,
    height: int = 220,
) -> Markup:
    """An inline SVG line chart of one or more series of (x, y) points.

    Args:
        title: Shown above the plot (and as the SVG's title for screen readers).
        series: Name → points; points with a non-finite y are dropped.
        x_label: Label of the x axis.
        marks: x → label of points to mark (e.g. the champion), drawn as rings.
        width: Width in px.
        height: Height in px.

    Returns:
        ``<svg>`` markup (values escaped), or a short note when there is nothing to plot.
    """
    clean = {k: [(float(x), float(y)) for x, y in pts if _finite(y)] for k, pts in series.items()}
    clean = {k: v for k, v in clean.items() if v}
    if not clean:
        return Markup(f'<p class="muted">{escape(title)}: nothing recorded</p>')
    xs = [x for pts in clean.values() for x, _ in pts]
    ys = [y for pts in clean.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 0.5
        y0, y1 = y0 - pad, y1 + pad
    left, right, top, bottom = 48, 12, 28, 34
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="16" class="ct">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" class="axis"/>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = y0 + frac * (y1 - y0)
        out.append(
            f'<text x="{left - 4}" y="{py(y) + 4:.1f}" class="tick" text-anchor="end">'
            f"{y:.3g}</text>"
        )
    for x in sorted(set(xs))[:: max(1, len(set(xs)) // 8)]:
        out.append(
            f'<text x="{px(x):.1f}" y="{top + ph + 14}" class="tick" text-anchor="middle">'
            f"{x:g}</text>"
        )
    if x_label:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="{height - 4}" class="tick" '
            f'text-anchor="middle">{escape(x_label)}</text>'
        )
    for i, (name, pts) in enumerate(clean.items()):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                f"<title>{escape(name)} {x:g}: {y:.4g}</title></circle>"
            )
            if marks and x in marks:
                out.append(
                    f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="7" fill="none" '
                    f'stroke="{color}" stroke-width="1.5"><title>{escape(marks[x])}'
                    "</title></circle>"
                )
        out.append(
            f'<text x="{left + pw - 4 - 110 * i}" y="16" class="lg" fill="{color}" '
            f'text-anchor="end">{escape(name)}</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))


def bar_chart(
    title: str, bars: Sequence[tuple[str, float, bool]], width: int = 420, bar_h: int = 18
) -> Markup:
    """An inline SVG horizontal bar chart, failing bars in red.

    Args:
        title: Shown above the bars.
        bars: (label, value, passed) per bar; non-finite values are listed, not drawn.
        width: Width in px.
        bar_h: Height of one bar in px.

    Returns:
        ``<svg>`` markup (values escaped), or a short note when there is nothing to plot.
    """
    if not bars:
        return Markup(f'<p class="muted">{escape(title)}: nothing recorded</p>')
    top, right = 26, 60
    labels = [_short(label) for label, _, _ in bars]
    label_w = 12 + math.ceil(max(_text_px(label) for label in labels))
    width = max(width, label_w + 200 + right)
    height = top + len(bars) * (bar_h + 6) + 6
    peak = max((v for _, v, _ in bars if _finite(v)), default=0.0) or 1.0
    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<text x="8" y="16" class="ct">{escape(title)}</text>',
    ]
    for i, (label, value, passed) in enumerate(bars):
        y = top + i * (bar_h + 6)
        color = PALETTE[0] if passed else PALETTE[1]
        shown = f"{value:.4g}" if _finite(value) else str(value)
        length = (width - label_w - right) * max(0.0, value) / peak if _finite(value) else 0
        out.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 5}" class="tick" text-anchor="end">'
            f"{escape(labels[i])}</text>"
            f'<rect x="{label_w}" y="{y}" width="{length:.1f}" height="{bar_h}" fill="{color}">'
            f"<title>{escape(label)}: {escape(shown)}</title></rect>"
            f'<text x="{label_w + length + 4:.1f}" y="{y + bar_h - 5}" class="tick">'
            f"{escape(shown)}</text>"
        )
    out.append("</svg>")
    return Markup("".join(out))


def share_chart(
    title: str, rows: Sequence[tuple[str, float, float]], width: int = 420, bar_h: int = 9
) -> Markup:
    """An inline SVG of each category's share now and before, two bars per category.

    Args:
        title: Shown above the bars.
        rows: ``(category, share now, share before)``; shares in [0, 1].
        width: Width in px.
        bar_h: Height of one bar in px.

    Returns:
        ``<svg>`` markup (values escaped), or a short note when there is nothing to plot.
    """
    if not rows:
        return Markup(f'<p class="muted">{escape(title)}: nothing recorded</p>')
    top, right = 26, 60
    labels = [_short(str(label), 32) for label, _, _ in rows]
    label_w = 12 + math.ceil(max(_text_px(label) for label in labels))
    width = max(width, label_w + 200 + right)
    height = top + len(rows) * (2 * bar_h + 8) + 6
    peak = max((max(a, b) for _, a, b in rows if _finite(a) and _finite(b)), default=0.0) or 1.0
    out = [
        f'<svg class="chart shares" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<text x="8" y="16" class="ct">{escape(title)}</text>',
        f'<text x="{width - 8}" y="16" class="lg" text-anchor="end">'
        f'<tspan fill="{PALETTE[0]}">■ now</tspan> <tspan fill="{PALETTE[5]}">■ before</tspan>'
        "</text>",
    ]
    for i, (label, now, before) in enumerate(rows):
        y = top + i * (2 * bar_h + 8)
        out.append(
            f'<text x="{label_w - 6}" y="{y + 2 * bar_h - 3}" class="tick" text-anchor="end">'
            f"{escape(labels[i])}</text>"
        )
        for j, (value, color, when) in enumerate(((now, PALETTE[0], "now"),
                                                  (before, PALETTE[5], "before"))):  # fmt: skip
            length = (width - label_w - right) * max(0.0, value) / peak if _finite(value) else 0
            shown = f"{value:.1%}" if _finite(value) else str(value)
            out.append(
                f'<rect x="{label_w}" y="{y + j * bar_h}" width="{length:.1f}" '
                f'height="{bar_h - 1}" fill="{color}"><title>{escape(str(label))} '
                f"{when}: {shown}</title></rect>"
                f'<text x="{label_w + length + 4:.1f}" y="{y + j * bar_h + bar_h - 2}" '
                f'class="tick">{escape(shown)}</text>'
            )
    out.append("</svg>")
    return Markup("".join(out))


def _sample_keys(failure: Mapping[str, Any]) -> list[str]:
    """The keys of a failed rule's sample rows (a report written before keys: the rows)."""
    keys = failure.get("keys") or []
    if keys:
        return [str(k) for k in keys[:5]]
    return [f"row {i}" for i in (failure.get("rows") or [])[:5]]


def _failed_rules(val: Mapping[str, Any]) -> list[list[Any]]:
    """The validation's failed rules as table rows: severity, rule, column, count, samples."""
    return [
        [
            r.get("severity"),
            r.get("rule"),
            r.get("column") or "—",
            r.get("unexpected_count"),
            ", ".join(repr(s) for s in (r.get("samples") or [])[:5]),
            ", ".join(_sample_keys(r)),
            r.get("reason"),
        ]
        for r in val.get("rules") or []
        if not r.get("success")
    ]


def _window_of(version: Mapping[str, Any]) -> tuple[int, str, str]:
    """A version's training window: its snapshots' count, what it saw, each snapshot."""
    from trainyard.volumes.window import seen_text

    window = [s for s in version.get("snapshots") or [] if isinstance(s, dict)]
    seen = seen_text(window, version.get("rows")) if window else ""
    each = ", ".join(
        f"{s.get('snapshot_id')}" + (f" [{s['interval'][0]} .. {s['interval'][1]})"
        if isinstance(s.get("interval"), list) and len(s["interval"]) == 2 else "")
        for s in window
    )  # fmt: skip
    return len(window), seen, each


def _text_px(text: str, size: float = 10.0) -> float:
    """At least the width of ``text`` in a sans-serif font of ``size`` px (no font at hand)."""
    em = 0.0
    for ch in text:
        if ch in "mwMW@%":
            em += 0.95
        elif ch.isupper() or not ch.isascii():
            em += 0.78
        elif ch in "ijlrtf.,:;|!()[]' ":
            em += 0.4
        else:
            em += 0.62
    return em * size


def _short(label: str, most: int = 48) -> str:
    """A chart label of at most ``most`` characters (the bar's tooltip keeps it whole)."""
    return label if len(label) <= most else label[: most - 1] + "…"


def _drift_charts(val: Mapping[str, Any]) -> list[Markup]:
    """The drift per column and, per categorical column, its categories' shares."""
    rules = [r for r in val.get("rules") or [] if str(r.get("rule", "")).startswith("drift:")]
    if not rules:
        return []
    bars = [
        (
            f"{r.get('column')} ({str(r['rule']).split(':', 1)[1]})",
            r.get("observed"),
            bool(r.get("success")),
        )
        for r in rules
    ]
    against = val.get("previous_snapshot_id")
    title = f"drift per column vs snapshot {against}" if against else "drift per column"
    charts = [bar_chart(title, bars)]
    shown: set[str] = set()
    for r in rules:  # a categorical column's shares, now and before, once per column
        categories = (r.get("details") or {}).get("categories")
        if not categories or r.get("column") in shown:
            continue
        shown.add(str(r.get("column")))
        rows = [(str(c[0]), float(c[1]), float(c[2])) for c in categories if len(c) == 3]
        charts.append(share_chart(f"{r.get('column')}: share of each category", rows))
    return charts


def _profile_rows(val: Mapping[str, Any]) -> list[list[Any]]:
    """The validation profile: null share, distinct and unseen categories, top categories."""
    rows = []
    for column, p in (val.get("profile") or {}).items():
        if not p.get("nulls") and "categories" not in p:
            continue
        top = ", ".join(
            f"{c[0]} {float(c[2]):.0%}" for c in (p.get("categories") or [])[:5] if len(c) == 3
        )
        unseen = p.get("unseen_share")
        null_share = f"{float(p.get('null_share') or 0):.1%}"
        unseen_share = "" if unseen is None else f"{float(unseen):.1%}"
        rows.append([column, null_share, p.get("distinct", ""), unseen_share, top])
    return rows


# --------------------------------------------------------------------------- HTML

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:16px;color:#1f2937;background:#fff}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:16px;margin:20px 0 6px;border-bottom:1px solid #e5e7eb}
table{border-collapse:collapse;margin:4px 0}.tw{overflow-x:auto;max-width:100%}
td,th{border:1px solid #e5e7eb;padding:3px 8px;text-align:left}
th{background:#f9fafb}.muted{color:#6b7280}.ok{color:#15803d;font-weight:600}
.bad{color:#b91c1c;font-weight:600}.warn{color:#b45309;font-weight:600}
.chart{border:1px solid #e5e7eb;margin:4px 8px 4px 0;background:#fff}
.ct{font-weight:600;font-size:12px}.tick{font-size:10px;fill:#6b7280}.lg{font-size:11px}
.axis{stroke:#9ca3af}.reason{padding:6px 10px;background:#f3f4f6;border-left:4px solid #9ca3af}
.reason.promote{border-color:#16a34a}.reason.reject{border-color:#dc2626}
code{font-size:12px}
"""


TEMPLATES = Path(__file__).parent / "templates"


@functools.cache
def _templates() -> Environment:
    """The pages' templates (``templates/*.html.j2``): autoescaped, None shown as nothing."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=lambda value: "" if value is None else value,
    )
    env.filters |= {"num": _num, "pct": lambda share: f"{share:.1%}"}
    env.tests["finite"] = _finite
    env.globals |= {
        "css": Markup(CSS),
        "curves": _curves,
        "drift_charts": _drift_charts,
        "format_metrics": format_metrics,
        "failed_rules": _failed_rules,
        "profile_rows": _profile_rows,
        "residuals": _residuals,
        "window_of": _window_of,
    }
    return env


def _render(template: str, **context: Any) -> str:
    return _templates().get_template(template).render(**context)


def _num(value: Any) -> str:
    """A figure as the pages show it: four decimals for a float, nothing for None."""
    if _finite(value) and not isinstance(value, int):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def _curves(curves: Mapping[str, Any]) -> list[Markup] | None:
    """The per-epoch charts (loss, then the other figures); None when no epoch is recorded."""
    epochs = [e for e in curves.get("epochs") or [] if isinstance(e, dict)]
    if not epochs:
        return None
    names = [k for k in epochs[-1] if k not in ("epoch", "attempt") and _finite(epochs[-1][k])]
    charts = []
    for group in (["loss"], [n for n in names if n != "loss"]):
        present = [n for n in group if n in names]
        if not present:
            continue
        series = {n: [(e["epoch"] + 1, e.get(n)) for e in epochs if "epoch" in e] for n in present}
        charts.append(line_chart(" / ".join(present) + " per epoch", series, "epoch"))
    return charts


def _residuals(diag: Mapping[str, Any]) -> tuple[Markup, str]:
    """A regressor's holdout residuals: their histogram and summary statistics."""
    edges, counts = diag.get("edges") or [], diag.get("counts") or []
    last = min(len(counts), len(edges) - 1) - 1

    def label(i: int) -> str:  # the outer bins also hold the tails beyond them
        if i == 0 and last > 0:
            return f"< {edges[1]:.3g}"
        if i == last and last > 0:
            return f"≥ {edges[i]:.3g}"
        return f"{edges[i]:.3g} … {edges[i + 1]:.3g}"

    bars = [(label(i), float(c), True) for i, c in enumerate(counts) if i <= last]
    stats = ", ".join(f"{k} {_num(diag.get(k))}" for k in ("mean", "std", "p05", "p50", "p95"))
    title = f"residuals (prediction - target) of {diag.get('n')} holdout rows"
    return bar_chart(title, bars), stats


def _unsummarised(story: Mapping[str, Any]) -> str:
    """Why a run has no summary, from Airflow's state of it when the plugin added it.

    The story's ``airflow_state``, ``failed`` (its failed tasks) and ``failure`` (the
    reason the failed step recorded).
    """
    state, failed = story.get("airflow_state"), list(story.get("failed") or ())
    if state == "failed" and failed:
        why = story.get("failure") or "no reason recorded: see the task's log"
        return f"the run failed at {', '.join(failed)}: {why}"
    if state == "failed":
        return "the run failed before its summary"
    if state in ("running", "queued"):
        return f"the run is {state}"
    return "still running, or stopped before its summary"


def render_run(story: Mapping[str, Any], data_docs_url: str | None, pipeline_url: str) -> str:
    """The run page: snapshot, validation, training, gate, serving and history.

    Args:
        story: :func:`run_story`'s result.
        data_docs_url: Where the plugin serves the snapshot's Data Docs (None: none).
        pipeline_url: The pipeline page.

    Returns:
        The HTML page.
    """
    rec, gate = story.get("record") or {}, story.get("gate") or {}
    cand, champ = gate.get("candidate_metrics") or {}, gate.get("champion_metrics") or {}
    return _render(
        "run.html.j2",
        story=story,
        rec=rec,
        snap=story.get("snapshot"),
        version=story.get("version"),
        gate=gate,
        trained={**(rec.get("train") or {}), **(rec.get("register") or {})},
        metric_names=list(dict.fromkeys([*cand, *champ])),
        unsummarised=_unsummarised(story),
        data_docs_url=data_docs_url,
        pipeline_url=pipeline_url,
    )


def render_pipeline(story: Mapping[str, Any], run_url: Any) -> str:
    """The pipeline page: versions over time with metrics, snapshots, champion, rollbacks.

    Args:
        story: :func:`pipeline_story`'s result.
        run_url: A callable mapping a run id to its run page URL.

    Returns:
        The HTML page.
    """
    versions = story.get("versions") or []
    champion = (story.get("champion") or {}).get("version")
    holdout: dict[str, list[tuple[float, float]]] = {}
    for v in versions:
        for name, value in ((v.get("gate") or {}).get("candidate_metrics") or {}).items():
            holdout.setdefault(name, []).append((v["version"], value))
    marks = {float(champion): "champion"} if champion else None
    charts = []
    for group in (["loss"], [n for n in holdout if n != "loss"]):
        series = {n: holdout[n] for n in group if n in holdout}
        if series:
            title = " / ".join(series) + " (holdout) per version"
            charts.append(line_chart(title, series, "version", marks))
    history = story.get("history") or []
    return _render(
        "pipeline.html.j2",
        story=story,
        versions=versions,
        champion=champion,
        charts=charts,
        rolled_back={ev.get("from") for ev in history if ev.get("event") == "rollback"},
        run_url=run_url,
    )
