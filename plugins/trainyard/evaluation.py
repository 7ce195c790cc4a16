"""Evaluation on the holdout split and the declarative promotion gate.

``evaluate_model`` runs a SavedModel's ``serving_default`` signature over examples and
computes the metrics a pipeline's gate names (overall and per slice, ``<metric>@<column>=
<value>``). ``decide`` is the gate itself: a pure function of the gate config, the
candidate's and the champion's metrics and an optional force request, returning a
``GateDecision`` that lists every check and renders as markdown (``gate.md``) and JSON
(``gate.json``). ``evaluate_and_decide`` wires both to the registry and the snapshot the
candidate was trained on. A gate that cannot decide (missing metric, NaN, evaluation crash,
unreadable champion) rejects, and says why.

TensorFlow is imported inside the functions that run a model, never at module level.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from trainyard.config import DEFAULT_GATE_METRICS, HIGHER_IS_BETTER, GateConfig, Threshold
from trainyard.errors import ConfigError, EvaluationError, GateRejected, TrainyardError

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.registry import Registry

log = logging.getLogger("trainyard.evaluation")

KNOWN_METRICS = tuple(HIGHER_IS_BETTER)
_EPS = 1e-7  # probability clip of the cross-entropy, as Keras does
_TOL = 1e-9  # float slack when comparing a metric with a bound
_MAX_SLICES = 256


class ExamplesLike(Protocol):
    """What evaluation needs from ``trainyard.training.worker.data.Examples``."""

    features: dict[str, np.ndarray]
    labels: np.ndarray
    keys: list[str]


# --------------------------------------------------------------------- metrics


def _binary_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney U statistic (average ranks for ties)."""
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(score, kind="mergesort")
    _, inverse, counts = np.unique(score[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg_rank = (ends - counts + 1 + ends) / 2.0
    ranks = np.empty(score.size, dtype=np.float64)
    ranks[order] = avg_rank[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _auc(labels: np.ndarray, probs: np.ndarray) -> float:
    if probs.shape[1] == 1:
        return _binary_auc(labels == 1, probs[:, 0])
    if probs.shape[1] == 2:
        return _binary_auc(labels == 1, probs[:, 1])
    per_class = [_binary_auc(labels == c, probs[:, c]) for c in range(probs.shape[1])]
    finite = [a for a in per_class if not math.isnan(a)]
    return float(np.mean(finite)) if finite else math.nan


def compute_metrics(
    outputs: Mapping[str, np.ndarray], labels: np.ndarray, metrics: Sequence[str]
) -> dict[str, float]:
    """Compute metrics from a model's outputs (pure numpy).

    Args:
        outputs: ``probabilities`` (n, classes) and ``class_id`` (n,) of a classifier, or
            ``predictions`` (n,) / (n, 1) of a regressor.
        labels: True labels (class ids, or targets for a regressor), shape (n,).
        metrics: Names from ``KNOWN_METRICS``.

    Returns:
        Metric name to value; NaN where a metric is undefined (e.g. AUC of one class, or
        no rows).

    Raises:
        EvaluationError: If a metric does not fit the model's outputs.
        ConfigError: If a metric name is unknown.
    """
    unknown = [m for m in metrics if m not in KNOWN_METRICS]
    if unknown:
        raise ConfigError(f"unknown gate metric(s) {unknown}; known: {', '.join(KNOWN_METRICS)}")
    result: dict[str, float] = {}
    n = int(labels.shape[0])
    if "probabilities" in outputs:
        probs = np.asarray(outputs["probabilities"], dtype=np.float64).reshape(n, -1)
        if "class_id" in outputs:
            class_id = np.asarray(outputs["class_id"]).reshape(n)
        elif probs.shape[1] == 1:
            class_id = (probs[:, 0] >= 0.5).astype(np.int64)
        else:
            class_id = probs.argmax(axis=1)
        y = labels.astype(np.int64)
        for m in metrics:
            if n == 0:
                result[m] = math.nan
            elif m == "accuracy":
                result[m] = float(np.mean(class_id == y))
            elif m == "loss":
                if probs.shape[1] == 1:
                    p = np.clip(probs[:, 0], _EPS, 1 - _EPS)
                    result[m] = float(-np.mean(np.where(y == 1, np.log(p), np.log(1 - p))))
                else:
                    p = np.clip(probs[np.arange(n), y], _EPS, 1.0)
                    result[m] = float(-np.mean(np.log(p)))
            elif m == "auc":
                result[m] = _auc(y, probs)
            else:
                raise EvaluationError(
                    f"metric {m!r} needs a regression output 'predictions'; the model outputs "
                    f"{sorted(outputs)}"
                )
        return result
    if "predictions" in outputs:
        pred = np.asarray(outputs["predictions"], dtype=np.float64).reshape(n, -1)[:, 0]
        err = pred - labels.astype(np.float64)
        for m in metrics:
            if n == 0:
                result[m] = math.nan
            elif m in ("rmse", "loss"):
                mse = float(np.mean(err**2))
                result[m] = math.sqrt(mse) if m == "rmse" else mse
            elif m == "mae":
                result[m] = float(np.mean(np.abs(err)))
            elif m == "r2":
                y = labels.astype(np.float64)
                total = float(np.sum((y - y.mean()) ** 2))
                result[m] = 1.0 - float(np.sum(err**2)) / total if total > 0 else math.nan
            else:
                raise EvaluationError(f"metric {m!r} needs a classifier output 'probabilities'")
        return result
    raise EvaluationError(
        f"model outputs {sorted(outputs)} hold neither 'probabilities' nor 'predictions'"
    )


def _slice_label(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _check_labels(
    labels: np.ndarray, keys: Sequence[str], outputs: Mapping[str, np.ndarray]
) -> None:
    if "probabilities" not in outputs:
        return
    classes = max(
        2, int(np.asarray(outputs["probabilities"]).reshape(labels.shape[0], -1).shape[1])
    )
    bad = np.flatnonzero((labels < 0) | (labels >= classes) | (labels != np.round(labels)))
    if bad.size:
        i = int(bad[0])
        key = keys[i] if i < len(keys) else "?"
        raise EvaluationError(
            f"holdout row {i} (key {key!r}), column label: value {labels[i].item()!r} is not "
            f"a class id in [0, {classes}) ({bad.size} such rows)"
        )


def metrics_with_slices(
    outputs: Mapping[str, np.ndarray],
    labels: np.ndarray,
    keys: Sequence[str],
    metrics: Sequence[str],
    slice_values: Mapping[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Overall metrics plus ``<metric>@<column>=<value>`` for every slice column's values.

    Args:
        outputs: The model outputs over all rows (see ``compute_metrics``).
        labels: True labels.
        keys: Row keys (named in errors).
        metrics: Metric names.
        slice_values: Column name to one value per row.

    Returns:
        The metrics.

    Raises:
        EvaluationError: If a slice column has the wrong length or too many values, or a
            label is not a class id.
    """
    labels = np.asarray(labels)
    _check_labels(labels, keys, outputs)
    result = compute_metrics(outputs, labels, metrics)
    for column, values in (slice_values or {}).items():
        values = np.asarray(values)
        if values.shape[0] != labels.shape[0]:
            raise EvaluationError(
                f"slice column {column!r} has {values.shape[0]} values for {labels.shape[0]} rows"
            )
        distinct = np.unique(values)
        if distinct.size > _MAX_SLICES:
            raise EvaluationError(
                f"slice column {column!r} has {distinct.size} distinct values (max {_MAX_SLICES})"
            )
        for value in distinct:
            mask = values == value
            sub = {k: np.asarray(v)[mask] for k, v in outputs.items()}
            for m, v in compute_metrics(sub, labels[mask], metrics).items():
                result[f"{m}@{column}={_slice_label(value)}"] = v
    return result


MAX_CONFUSION_CLASSES = 50
"""A classifier with more classes gets no confusion matrix (the run page could not show it)."""
RESIDUAL_BINS = 20


def diagnostics(outputs: Mapping[str, np.ndarray], labels: np.ndarray) -> dict[str, Any] | None:
    """What the run page draws of the candidate on the holdout, beyond its metrics.

    Args:
        outputs: The model outputs over all rows (see :func:`compute_metrics`).
        labels: True class ids, or a regressor's targets.

    Returns:
        A classifier's confusion matrix (``kind: confusion``, ``matrix[true][predicted]``
        counts, ``classes``; ``matrix`` is None past :data:`MAX_CONFUSION_CLASSES`), a
        regressor's residuals (``kind: residuals``: prediction - target as a histogram of
        :data:`RESIDUAL_BINS` bins over its 1st..99th percentile, the outer bins holding
        the tails, with ``mean``, ``std``, ``p05``, ``p50``, ``p95``), or None without rows.
    """
    labels = np.asarray(labels)
    n = int(labels.shape[0])
    if n == 0:
        return None
    if "probabilities" in outputs:
        probs = np.asarray(outputs["probabilities"]).reshape(n, -1)
        if "class_id" in outputs:
            predicted = np.asarray(outputs["class_id"]).reshape(n).astype(np.int64)
        elif probs.shape[1] == 1:
            predicted = (probs[:, 0] >= 0.5).astype(np.int64)
        else:
            predicted = probs.argmax(axis=1)
        y = labels.astype(np.int64)
        classes = max(2, probs.shape[1], int(y.max()) + 1, int(predicted.max()) + 1)
        if classes > MAX_CONFUSION_CLASSES:
            return {"kind": "confusion", "classes": classes, "matrix": None}
        matrix = np.zeros((classes, classes), np.int64)
        np.add.at(matrix, (y, predicted), 1)
        return {"kind": "confusion", "classes": classes, "matrix": matrix.tolist()}
    if "predictions" not in outputs:
        return None
    pred = np.asarray(outputs["predictions"], dtype=np.float64).reshape(n, -1)[:, 0]
    err = pred - labels.astype(np.float64)
    err = err[np.isfinite(err)]
    if err.size == 0:
        return None
    lo, hi = (float(q) for q in np.quantile(err, [0.01, 0.99]))
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, RESIDUAL_BINS + 1)
    counts, _ = np.histogram(np.clip(err, lo, hi), edges)
    p05, p50, p95 = (float(q) for q in np.quantile(err, [0.05, 0.5, 0.95]))
    return {
        "kind": "residuals",
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
        "mean": float(err.mean()),
        "std": float(err.std()),
        "p05": p05,
        "p50": p50,
        "p95": p95,
        "n": int(err.size),
    }


def _run_model(
    model_dir: Path | str, features: Mapping[str, np.ndarray], batch_size: int = 1024
) -> dict[str, np.ndarray]:
    """Call a SavedModel's ``serving_default`` over the features in batches."""
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(str(model_dir))
        fn = loaded.signatures["serving_default"]
    except (OSError, KeyError, ValueError, RuntimeError, tf.errors.OpError) as e:
        raise EvaluationError(f"{model_dir}: cannot load a serving_default signature: {e}") from e
    specs: dict[str, Any] = fn.structured_input_signature[1]
    missing = sorted(set(specs) - set(features))
    if missing:
        raise EvaluationError(
            f"{model_dir}: model inputs {missing} are not in the examples' features "
            f"{sorted(features)}"
        )
    n = int(next(iter(features.values())).shape[0]) if features else 0
    chunks: dict[str, list[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        batch = {
            name: tf.constant(
                np.asarray(features[name][start : start + batch_size]), dtype=spec.dtype
            )
            for name, spec in specs.items()
        }
        try:
            out = fn(**batch)
        except (ValueError, TypeError, tf.errors.OpError) as e:
            raise EvaluationError(
                f"{model_dir}: rows {start}..{start + batch_size - 1}: {e}"
            ) from e
        for name, tensor in out.items():
            chunks.setdefault(name, []).append(tensor.numpy())
    if not chunks:
        return {name: np.zeros((0,)) for name in fn.structured_outputs}
    return {name: np.concatenate(parts) for name, parts in chunks.items()}


def evaluate_model(
    model_dir: Path | str,
    examples: ExamplesLike,
    metrics: Sequence[str],
    slices: Sequence[str] | None = None,
    slice_values: Mapping[str, np.ndarray] | None = None,
    batch_size: int = 1024,
) -> dict[str, float]:
    """Evaluate a SavedModel on examples.

    Args:
        model_dir: SavedModel directory with a ``serving_default`` signature.
        examples: Features, labels and keys (``trainyard.training.worker.data.Examples``).
        metrics: Names from ``KNOWN_METRICS``.
        slices: Columns to slice by (each must be in ``slice_values``).
        slice_values: Column name to one value per example.
        batch_size: Rows per signature call.

    Returns:
        Metric name to value, overall and per slice (``accuracy@label=3``).

    Raises:
        EvaluationError: If the model cannot be loaded or run, or inputs do not fit.
    """
    values = _select_slices(slices, slice_values)
    outputs = _run_model(model_dir, examples.features, batch_size)
    return metrics_with_slices(outputs, examples.labels, examples.keys, metrics, values)


def _select_slices(
    slices: Sequence[str] | None, slice_values: Mapping[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    missing = [c for c in slices or () if c not in (slice_values or {})]
    if missing:
        raise EvaluationError(
            f"slice column(s) {missing} have no values (got {sorted(slice_values or {})})"
        )
    return {c: np.asarray((slice_values or {})[c]) for c in slices or ()}


def gate_metrics(gate: GateConfig) -> list[str]:
    """The metrics a gate reports: its own, else a classifier's defaults.

    ``evaluate_and_decide`` fills in the defaults of the contract's task first
    (``GateConfig.for_task``).
    """
    return list(
        gate.metrics if gate.metrics is not None else DEFAULT_GATE_METRICS["classification"]
    )


def required_metrics(gate: GateConfig) -> list[str]:
    """The base metrics a gate reads: its ``metrics``, thresholds and champion rule.

    A gate whose ``metrics`` were not given (see ``GateConfig.for_task``) reads a
    classifier's defaults.
    """
    names = gate_metrics(gate)
    names += [k.split("@", 1)[0] for k in gate.thresholds]
    if gate.champion:
        names.append(gate.champion.metric.split("@", 1)[0])
    return list(dict.fromkeys(names))


# --------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class ForceRequest:
    """A person's request to promote whatever the gate says (the ``force_promote`` param).

    Attributes:
        actor: Who asked.
        reason: Why (required, non-empty).
        at: When (ISO timestamp).
    """

    actor: str
    reason: str
    at: str

    def __post_init__(self) -> None:
        if not str(self.reason or "").strip():
            raise GateRejected("force_promote needs a non-empty reason (force_reason)")
        if not str(self.actor or "").strip():
            raise GateRejected("force_promote needs the actor who asked for it")
        if isinstance(self.at, dt.datetime):
            object.__setattr__(self, "at", self.at.isoformat())


@dataclass(frozen=True)
class Check:
    """One line of the gate report."""

    name: str
    metric: str
    candidate: float | None
    champion: float | None
    threshold: str
    passed: bool
    note: str = ""


Verdict = Literal["promote", "reject", "forced"]


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


@dataclass(frozen=True)
class GateDecision:
    """The gate's verdict with every check behind it.

    Attributes:
        promote: Whether the candidate may be deployed and made champion.
        verdict: ``promote``, ``reject`` or ``forced`` (promoted over failed checks).
        reason: One readable sentence.
        checks: Every check, in order.
        first_run: There was no champion, so only thresholds were checked.
        force: The force request, if any.
        candidate_metrics: The candidate's metrics.
        champion_metrics: The champion's metrics (None on the first run).
        version: The candidate version (set by ``evaluate_and_decide``).
        champion_version: The champion version it was compared with.
        smoke: ``{"keys": [...], "class_ids": [...]}``: the candidate's predictions for the
            first holdout rows, for the deploy smoke test.
        fail_run_on_reject: The pipeline wants a rejection to fail the run.
        timings: Seconds spent evaluating (``candidate_seconds``, ``champion_seconds``).
        diagnostics: The candidate's confusion matrix or residuals (:func:`diagnostics`).
    """

    promote: bool
    verdict: Verdict
    reason: str
    checks: list[Check]
    first_run: bool
    force: ForceRequest | None = None
    candidate_metrics: dict[str, float] = field(default_factory=dict)
    champion_metrics: dict[str, float] | None = None
    version: int | None = None
    champion_version: int | None = None
    smoke: dict[str, list[Any]] | None = None
    fail_run_on_reject: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``gate.json``); non-finite numbers become null."""
        return _clean(
            {
                "promote": self.promote,
                "verdict": self.verdict,
                "reason": self.reason,
                "first_run": self.first_run,
                "checks": [dataclasses.asdict(c) for c in self.checks],
                "force": dataclasses.asdict(self.force) if self.force else None,
                "candidate_metrics": self.candidate_metrics,
                "champion_metrics": self.champion_metrics,
                "version": self.version,
                "champion_version": self.champion_version,
                "smoke": self.smoke,
                "fail_run_on_reject": self.fail_run_on_reject,
                "timings": self.timings,
                "diagnostics": self.diagnostics,
            }
        )

    def to_json(self) -> str:
        """``gate.json`` content."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    def to_markdown(self) -> str:
        """``gate.md``: the verdict, its reason and a table of every check."""
        who = f"version {self.version}" if self.version is not None else "candidate"
        if self.champion_version is not None:
            against = f"champion version {self.champion_version}"
        else:
            against = "no champion" if self.champion_metrics is None else "the champion"
        lines = [
            f"## Gate: {self.verdict.upper()} ({who} vs {against})",
            "",
            f"**Verdict:** {self.verdict}. {self.reason}",
            "",
        ]
        if self.first_run:
            lines += ["First run: there is no champion yet, so only absolute thresholds apply.", ""]
        if self.force:
            lines += [
                f"Force promote requested by **{self.force.actor}** at {self.force.at}: "
                f"{self.force.reason}",
                "",
            ]
        lines += [
            "| check | metric | candidate | champion | threshold | result | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in self.checks:
            cells = [
                c.name,
                c.metric,
                _fmt(c.candidate),
                _fmt(c.champion),
                c.threshold,
                "pass" if c.passed else "**FAIL**",
                c.note,
            ]
            lines.append("| " + " | ".join(s.replace("|", "\\|") for s in cells) + " |")
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, Any]:
        """What the evaluate step returns (XCom): verdict, reason, metrics, the report."""
        return _clean(
            {
                "promote": self.promote,
                "verdict": self.verdict,
                "reason": self.reason,
                "first_run": self.first_run,
                "version": self.version,
                "champion": self.champion_version,
                "metrics": self.candidate_metrics,
                "champion_metrics": self.champion_metrics,
                "forced_by": self.force.actor if self.force and self.verdict == "forced" else None,
                "fail_run_on_reject": self.fail_run_on_reject,
                "report": self.to_markdown(),
            }
        )

    def report_files(self) -> dict[str, bytes]:
        """``gate.md`` and ``gate.json`` as bytes, ready for ``Registry.attach``."""
        return {"gate.md": self.to_markdown().encode(), "gate.json": self.to_json().encode()}


def _bound_text(th: Threshold) -> str:
    parts = []
    if th.min is not None:
        parts.append(f">= {th.min:g}")
    if th.max is not None:
        parts.append(f"<= {th.max:g}")
    return " and ".join(parts) or "any"


def _threshold_check(
    name: str,
    metric: str,
    th: Threshold,
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
) -> Check:
    raw = candidate.get(metric)
    value = _finite(raw)
    champ = _finite((champion or {}).get(metric))
    if value is None:
        note = "missing" if raw is None else f"not a finite number ({raw!r})"
        return Check(name, metric, None, champ, _bound_text(th), False, note)
    low_ok = th.min is None or value >= th.min - _TOL
    high_ok = th.max is None or value <= th.max + _TOL
    note = "" if low_ok and high_ok else ("below minimum" if not low_ok else "above maximum")
    return Check(name, metric, value, champ, _bound_text(th), low_ok and high_ok, note)


def _champion_check(
    gate: GateConfig, candidate: Mapping[str, Any], champion: Mapping[str, Any]
) -> Check:
    assert gate.champion is not None
    rule = gate.champion
    metric = rule.metric
    cand, champ = _finite(candidate.get(metric)), _finite(champion.get(metric))
    name = f"champion:{metric}"
    if cand is None or champ is None:
        whose = "candidate" if cand is None else "champion"
        return Check(name, metric, cand, champ, "-", False, f"{whose} value missing or not finite")
    required = rule.min_improvement if rule.min_improvement > 0 else -rule.max_regression
    scale = abs(champ) if rule.relative else 1.0
    sign = 1.0 if rule.higher_is_better else -1.0
    bound = champ + sign * required * scale
    op = ">=" if rule.higher_is_better else "<="
    passed = (cand >= bound - _TOL) if rule.higher_is_better else (cand <= bound + _TOL)
    unit = f"{required:+.2%} of champion" if rule.relative else f"{required:+g}"
    kind = (
        "improvement" if required > 0 else ("tolerated regression" if required < 0 else "no worse")
    )
    threshold = f"{op} {bound:.4f} (champion {unit}, {kind})"
    delta = (cand - champ) * sign
    trend = "improves" if delta > 0 else "regresses" if delta < 0 else "equals"
    note = "equals the champion" if delta == 0 else f"{trend} by {abs(cand - champ):.4f}"
    return Check(name, metric, cand, champ, threshold, passed, note)


def _time_check(candidate: str | None, champion: str | None) -> Check:
    """The candidate's newest data must not be older than the champion's."""
    from trainyard.volumes import _instant

    name, rule = "time:data", "newest data >= champion's"
    if candidate is None or champion is None:
        whose = "candidate's" if candidate is None else "champion's"
        return Check(name, "data_until", None, None, rule, True, f"{whose} data time unknown")
    try:
        older = _instant(candidate) < _instant(champion)
    except ValueError as e:
        return Check(name, "data_until", None, None, rule, False, f"unreadable data time: {e}")
    if older:
        note = (
            f"trained on data up to {candidate}, older than the champion's (up to {champion}): "
            "not promoted unless forced with a reason"
        )
        return Check(name, "data_until", None, None, rule, False, note)
    return Check(name, "data_until", None, None, rule, True, f"{candidate} vs {champion}")


def decide(
    gate: GateConfig,
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    force: ForceRequest | None = None,
    *,
    candidate_error: str | None = None,
    champion_error: str | None = None,
    data_times: tuple[str | None, str | None] | None = None,
    not_compared: str | None = None,
) -> GateDecision:
    """Apply a gate to the candidate's (and the champion's) metrics. Pure: no I/O.

    With ``data_times`` the gate also checks time: a candidate whose newest data (the
    latest interval of its training window) is older than the champion's fails the
    ``time:data`` check, so it is not promoted unless forced (with a reason).

    Args:
        gate: The pipeline's gate.
        candidate: The candidate's metrics (overall and ``<metric>@<column>=<value>``).
        champion: The champion's metrics on the same holdout, or None if there is no
            champion (the first run: thresholds only).
        force: A force-promote request; it promotes over failed checks, and is recorded.
        candidate_error: Why the candidate could not be evaluated (rejects).
        champion_error: Why the champion could not be evaluated (rejects: the gate cannot
            decide), e.g. an unreadable champion pointer.
        data_times: ``(candidate's newest data, champion's newest data)`` as ISO times
            (None where unknown); the champion's is ignored when there is no champion.
        not_compared: Why a champion exists but its metrics cannot be compared (a model of
            another task): thresholds (and time) decide, and the reason says so.

    Returns:
        The decision with every check.
    """
    checks: list[Check] = []
    if not_compared:
        checks.append(Check("champion:comparable", "-", None, None, "-", True, not_compared))
    if candidate_error:
        checks.append(Check("evaluate:candidate", "-", None, None, "-", False, candidate_error))
    if champion_error:
        checks.append(Check("evaluate:champion", "-", None, None, "-", False, champion_error))
    first_run = champion is None and not champion_error and not not_compared
    for metric in gate_metrics(gate):
        raw = candidate.get(metric)
        value = _finite(raw)
        note = "" if value is not None else ("missing" if raw is None else f"not finite ({raw!r})")
        champ = _finite((champion or {}).get(metric))
        checks.append(
            Check(f"metric:{metric}", metric, value, champ, "finite", value is not None, note)
        )
    for metric, th in sorted(gate.thresholds.items()):
        checks.append(_threshold_check(f"threshold:{metric}", metric, th, candidate, champion))
    for column in gate.slices:
        prefix = f"@{column}="
        names = sorted(k for k in candidate if prefix in k)
        if not names:
            checks.append(
                Check(
                    f"slice:{column}",
                    "-",
                    None,
                    None,
                    "-",
                    False,
                    f"no metrics for slice column {column!r}",
                )
            )
            continue
        for metric, th in sorted(gate.thresholds.items()):
            if "@" in metric:
                continue
            for name in (k for k in names if k.startswith(metric + prefix)):
                checks.append(
                    _threshold_check(
                        f"slice:{name.split('@', 1)[1]}", name, th, candidate, champion
                    )
                )
    if champion is not None and gate.champion is not None and not champion_error:
        checks.append(_champion_check(gate, candidate, champion))
    if data_times is not None and (champion is not None or champion_error or not_compared):
        checks.append(_time_check(*data_times))

    failed = [c for c in checks if not c.passed]
    if not checks:
        failed_text = "the gate declares no checks, so it cannot decide"
    else:
        shown = "; ".join(f"{c.name} {c.note or 'failed'}".strip() for c in failed[:3])
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        failed_text = f"{len(failed)} of {len(checks)} checks failed: {shown}{more}"
    ok = bool(checks) and not failed
    champ_part = ""
    if gate.champion and champion is not None and not champion_error:
        c = next(c for c in checks if c.name.startswith("champion:"))
        champ_part = f"; {c.metric} {_fmt(c.candidate)} vs champion {_fmt(c.champion)}"
    if ok:
        verdict: Verdict = "promote"
        first = " (first run: no champion, thresholds only)" if first_run else ""
        if not_compared:
            first = f" (champion not compared: {not_compared}; thresholds only)"
        reason = f"All {len(checks)} checks passed{first}{champ_part}."
        if force:
            reason += f" Force promote by {force.actor} was not needed."
    elif force:
        verdict = "forced"
        reason = (
            f"Forced by {force.actor} at {force.at} ({force.reason}) over the gate: {failed_text}."
        )
    else:
        verdict = "reject"
        reason = f"Rejected: {failed_text}{champ_part}."
    return GateDecision(
        promote=verdict != "reject",
        verdict=verdict,
        reason=reason,
        checks=checks,
        first_run=first_run,
        force=force,
        candidate_metrics=dict(candidate),
        champion_metrics=dict(champion) if champion is not None else None,
        fail_run_on_reject=gate.fail_run_on_reject,
    )


# --------------------------------------------------------------------- wiring


def run_gate(
    gate: GateConfig,
    candidate_dir: Path | str,
    champion_dir: Path | str | None,
    examples: ExamplesLike,
    slice_values: Mapping[str, np.ndarray] | None = None,
    force: ForceRequest | None = None,
    smoke_rows: int = 8,
    champion_error: str | None = None,
    data_times: tuple[str | None, str | None] | None = None,
    not_compared: str | None = None,
) -> GateDecision:
    """Evaluate candidate and champion on the same examples, then ``decide``.

    An evaluation that fails (any exception: a corrupt SavedModel, a signature that does not
    fit the features) does not raise: it becomes a failed check, so the gate rejects with
    the reason.

    Args:
        gate: The pipeline's gate.
        candidate_dir: The candidate SavedModel.
        champion_dir: The champion SavedModel, or None on the first run.
        examples: The holdout examples.
        slice_values: Slice column values per example.
        force: A force-promote request.
        smoke_rows: How many leading rows' predictions (class ids, or a regressor's
            numbers) to keep for the smoke test.
        champion_error: A champion that could not even be located (passed through).
        data_times: Candidate's and champion's newest data (see :func:`decide`).
        not_compared: Why the champion is not evaluated at all (see :func:`decide`).

    Returns:
        The decision, with ``smoke`` set when the candidate ran.
    """
    metrics = required_metrics(gate)
    candidate: dict[str, float] = {}
    candidate_error = None
    smoke = diag = None
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        values = _select_slices(gate.slices, slice_values)
        outputs = _run_model(candidate_dir, examples.features)
        candidate = metrics_with_slices(outputs, examples.labels, examples.keys, metrics, values)
        smoke = _smoke_record(outputs, examples.keys, smoke_rows)
        diag = diagnostics(outputs, examples.labels)
    except Exception as e:  # any failure means the gate cannot decide: reject with the reason
        log.exception("evaluating candidate %s failed", candidate_dir)
        candidate_error = f"candidate evaluation failed: {type(e).__name__}: {e}"
    timings["candidate_seconds"] = round(time.monotonic() - t0, 3)
    champion: dict[str, float] | None = None
    if champion_dir is not None and champion_error is None:
        t0 = time.monotonic()
        try:
            champion = evaluate_model(champion_dir, examples, metrics, gate.slices, slice_values)
        except Exception as e:  # an unreadable champion cannot be compared with: reject
            log.exception("evaluating champion %s failed", champion_dir)
            champion_error = f"champion evaluation failed: {type(e).__name__}: {e}"
        timings["champion_seconds"] = round(time.monotonic() - t0, 3)
    decision = decide(
        gate,
        candidate,
        champion,
        force,
        candidate_error=candidate_error,
        champion_error=champion_error,
        data_times=data_times,
        not_compared=not_compared,
    )
    return dataclasses.replace(decision, smoke=smoke, timings=timings, diagnostics=diag)


#: The output the deploy smoke test compares, and its key in ``gate.json``'s ``smoke``.
SMOKE_OUTPUTS = {"class_id": "class_ids", "predictions": "predictions"}


def _smoke_record(
    outputs: Mapping[str, np.ndarray], keys: Sequence[str], rows: int
) -> dict[str, Any] | None:
    """The leading rows' keys and predictions (``class_ids`` or ``predictions``)."""
    k = min(rows, len(keys))
    for output, key in SMOKE_OUTPUTS.items():
        if output in outputs:
            values = np.asarray(outputs[output]).reshape(-1)[:k].tolist()
            return {"keys": list(keys[:k]), key: values}
    return None


def _slice_values(
    snapshot_dirs: Path | Sequence[Path],
    contract: Any,
    examples: ExamplesLike,
    columns: Sequence[str],
) -> dict[str, np.ndarray]:
    """Slice columns aligned with the examples: the label, or a column of the table view.

    ``snapshot_dirs``: the snapshot, or every snapshot of the window the examples are from.
    """
    dirs = [snapshot_dirs] if isinstance(snapshot_dirs, Path | str) else list(snapshot_dirs)
    snapshot_dir = Path(dirs[-1])
    values: dict[str, np.ndarray] = {}
    table_columns = [c for c in columns if c != contract.roles.label]
    if contract.roles.label in columns:
        values[contract.roles.label] = np.asarray(examples.labels)
    if not table_columns:
        return values
    import pyarrow.parquet as pq

    from trainyard.fsutil import read_parquet
    from trainyard.volumes import table_files

    key = contract.roles.key
    lookup: dict[str, dict[str, Any]] = {c: {} for c in table_columns}
    for path in (f for d in dirs for f in table_files(Path(d))):
        names = pq.read_schema(path).names
        absent = [c for c in [key, *table_columns] if c not in names]
        if absent:
            raise EvaluationError(f"{path}: slice column(s) {absent} not in the table ({names})")
        table = read_parquet(path, [key, *table_columns]).to_pydict()
        for c in table_columns:
            lookup[c].update(zip(table[key], table[c], strict=True))
    for c in table_columns:
        try:
            values[c] = np.asarray([lookup[c][k] for k in examples.keys])
        except KeyError as e:
            raise EvaluationError(
                f"{snapshot_dir}: holdout key {e} has no row in the table view"
            ) from e
    return values


def newest_data(meta: Mapping[str, Any]) -> str | None:
    """The newest data a registered version was trained on (its ``data_until``).

    Versions registered before training windows name one snapshot: its interval start
    (or creation time) from the manifest, if the snapshot still exists.
    """
    from trainyard import volumes

    if meta.get("data_until"):
        return str(meta["data_until"])
    read = [s for s in meta.get("snapshots") or [] if isinstance(s, dict)]
    if read and volumes.data_until(read):
        return volumes.data_until(read)
    try:
        manifest = volumes.read_manifest(
            volumes.snapshot_dir(str(meta["dataset"]), str(meta["snapshot_id"]))
        )
    except (KeyError, TrainyardError):
        return None
    start = (manifest.interval or {}).get("start")
    return start or manifest.created_at


def window_dirs(meta: Mapping[str, Any]) -> list[Path]:
    """The snapshot folders a version was trained on (its window; else its one snapshot)."""
    from trainyard.volumes import snapshot_dir

    read = meta.get("snapshots") or [
        {"dataset": meta["dataset"], "snapshot_id": meta["snapshot_id"]}
    ]
    return [
        snapshot_dir(str(s.get("dataset") or meta["dataset"]), str(s["snapshot_id"])) for s in read
    ]


def _holdout(cfg: PipelineConfig, meta: Mapping[str, Any]) -> tuple[list[Path], Any, ExamplesLike]:
    """The holdout split of every snapshot the candidate was trained on, as one.

    Each snapshot's shards are checked against its manifest first, as validation and
    training check them: a damaged one raises ``SnapshotError`` naming the shard, instead
    of a gate computed on flipped bytes or a decoder's error.
    """
    from trainyard.contracts import load_contract
    from trainyard.training.worker.data import load_window_examples
    from trainyard.volumes import check_snapshot

    contract = load_contract(cfg.dataset)
    dirs = window_dirs(meta)
    for d in dirs:
        check_snapshot(d)
    return dirs, contract, load_window_examples(dirs, contract, "holdout")


def evaluate_and_decide(
    cfg: PipelineConfig, registry: Registry, version: int, force: ForceRequest | None = None
) -> GateDecision:
    """The evaluate step: gate a registered candidate and attach ``gate.md``/``gate.json``.

    Candidate and champion are evaluated on the holdout split of the snapshots the
    candidate was trained on (every snapshot of its training window, each split by its
    stable key hash). Anything that stops the gate from deciding (missing data, an unreadable
    champion pointer, a crashing model) becomes a failed check: the verdict is ``reject``.

    Args:
        cfg: The pipeline config (its ``gate`` and ``serving.smoke_rows``).
        registry: The pipeline's registry.
        version: The candidate version.
        force: A force-promote request.

    Returns:
        The decision (also stored next to the model).

    Raises:
        RegistryError: If the candidate version does not exist.
    """
    from trainyard.contracts import load_contract

    meta = registry.metadata(version)
    task = load_contract(cfg.dataset).roles.task
    gate = cfg.gate.for_task(task)
    champion_version: int | None = None
    champion_error = None
    try:
        champion_version = registry.champion()
    except TrainyardError as e:
        champion_error = f"champion unreadable: {e}"
    champion_time = None
    if champion_version is not None and champion_version != version:
        try:
            champion_time = newest_data(registry.metadata(champion_version))
        except TrainyardError as e:
            log.warning("champion v%s: data time unknown: %s", champion_version, e)
    data_times = (newest_data(meta), champion_time)
    not_compared = None
    if champion_version is not None and champion_version != version:
        # versions trained before task types were all classifiers
        try:
            champion_task = (registry.read_file(champion_version, "metrics.json") or {}).get(
                "task", "classification"
            )
        except TrainyardError:  # unreadable: evaluating the champion will say what is wrong
            champion_task = task
        if champion_task != task:
            not_compared = (
                f"champion v{champion_version} is a {champion_task} model and the "
                f"contract's task is now {task}"
            )
    try:
        snap, contract, examples = _holdout(cfg, meta)
        slice_values = _slice_values(snap, contract, examples, gate.slices)
    except Exception as e:  # no holdout data means no decision: reject with the reason
        log.exception("loading the holdout of %s v%s failed", cfg.name, version)
        if champion_version is not None and champion_error is None:
            champion_error = "not evaluated (no holdout data)"
        decision = decide(
            gate,
            {},
            None,
            force,
            candidate_error=f"holdout data unavailable: {type(e).__name__}: {e}",
            champion_error=champion_error,
            data_times=data_times,
        )
    else:
        champion_dir = (
            registry.version_dir(champion_version) / "model"
            if champion_version and not not_compared
            else None
        )
        decision = run_gate(
            gate,
            registry.version_dir(version) / "model",
            champion_dir,
            examples,
            slice_values,
            force,
            cfg.serving.smoke_rows,
            champion_error,
            data_times,
            not_compared,
        )
    decision = dataclasses.replace(decision, version=version, champion_version=champion_version)
    for name, data in decision.report_files().items():
        registry.attach(version, name, data)
    return decision


@dataclass(frozen=True)
class SmokeExamples:
    """Holdout rows for the deploy smoke test and what the model predicted for them offline.

    Attributes:
        keys: The rows' keys.
        features: Feature name → array (batch first).
        expected: One output's offline values: ``{"class_id": [...]}`` for a classifier,
            ``{"predictions": [...]}`` for a regressor.
    """

    keys: list[str]
    features: dict[str, np.ndarray]
    expected: dict[str, list[Any]]


def smoke_examples(
    cfg: PipelineConfig, registry: Registry, version: int, rows: int
) -> SmokeExamples:
    """The first ``rows`` holdout rows of a version's snapshot and its offline predictions.

    Uses the predictions recorded in ``gate.json`` when they cover the rows; otherwise runs
    the model.

    Args:
        cfg: The pipeline config.
        registry: The pipeline's registry.
        version: The version about to be deployed.
        rows: How many rows.

    Returns:
        Keys, features (numpy, batch first) and expected predictions.

    Raises:
        EvaluationError: If the holdout split is empty or the model cannot run.
    """
    _, _, examples = _holdout(cfg, registry.metadata(version))
    k = min(rows, len(examples.keys))
    if k == 0:
        raise EvaluationError(
            f"version {version}: the holdout split is empty, nothing to smoke-test"
        )
    keys = list(examples.keys[:k])
    features = {name: np.asarray(arr[:k]) for name, arr in examples.features.items()}
    recorded = (registry.read_file(version, "gate.json") or {}).get("smoke") or {}
    for output, key in SMOKE_OUTPUTS.items():
        if recorded.get("keys", [])[:k] == keys and len(recorded.get(key) or []) >= k:
            return SmokeExamples(keys, features, {output: list(recorded[key][:k])})
    record = _smoke_record(_run_model(registry.version_dir(version) / "model", features), keys, k)
    if record is None:
        raise EvaluationError(
            f"version {version}: the model has neither a 'class_id' nor a 'predictions' output"
        )
    output, key = next((o, f) for o, f in SMOKE_OUTPUTS.items() if f in record)
    return SmokeExamples(keys, features, {output: record[key]})
