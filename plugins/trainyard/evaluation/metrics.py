"""Metrics on the holdout split: a SavedModel's ``serving_default`` over examples.

``evaluate_model`` computes the metrics a pipeline's gate names, overall and per slice
(``<metric>@<column>=<value>``), and the diagnostics the run page draws (confusion
matrix, residuals). TensorFlow is imported inside the functions that run a model.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trainyard.config import (
    KNOWN_METRICS,
)
from trainyard.errors import ConfigError, EvaluationError

if TYPE_CHECKING:
    pass

log = logging.getLogger("trainyard.evaluation")

_EPS = 1e-7  # probability clip of the cross-entropy, as Keras does
_TOL = 1e-9  # float slack when comparing a metric with a bound
_MAX_SLICES = 256


class ExamplesLike(Protocol):
    """What evaluation needs from ``trainyard.training.worker.data.Examples``."""

    features: dict[str, np.ndarray]
    labels: np.ndarray
    keys: list[str]


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


def run_model(
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
    values = select_slices(slices, slice_values)
    outputs = run_model(model_dir, examples.features, batch_size)
    return metrics_with_slices(outputs, examples.labels, examples.keys, metrics, values)


def select_slices(
    slices: Sequence[str] | None, slice_values: Mapping[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The slice columns the gate names, out of those the examples carry."""
    missing = [c for c in slices or () if c not in (slice_values or {})]
    if missing:
        raise EvaluationError(
            f"slice column(s) {missing} have no values (got {sorted(slice_values or {})})"
        )
    return {c: np.asarray((slice_values or {})[c]) for c in slices or ()}
