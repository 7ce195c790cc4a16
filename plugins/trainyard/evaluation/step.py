"""The ``evaluate`` step's work: metrics and gate wired to the registry and the snapshots.

``evaluate_and_decide`` evaluates the candidate and the champion on the same holdout of
the candidate's training window, gates, and attaches the decision to the candidate.
An evaluation crash or an unreadable champion rejects, and says why.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainyard.config import (
    GateConfig,
)
from trainyard.errors import EvaluationError, TrainyardError
from trainyard.evaluation.gate import ForceRequest, GateDecision, decide, required_metrics
from trainyard.evaluation.metrics import (
    ExamplesLike,
    diagnostics,
    evaluate_model,
    metrics_with_slices,
    run_model,
    select_slices,
)

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.registry import Registry

log = logging.getLogger("trainyard.evaluation")


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
        values = select_slices(gate.slices, slice_values)
        outputs = run_model(candidate_dir, examples.features)
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

    from trainyard.volumes import table_files

    key = contract.roles.key
    lookup: dict[str, dict[str, Any]] = {c: {} for c in table_columns}
    for path in (f for d in dirs for f in table_files(Path(d))):
        names = pq.read_schema(path).names
        absent = [c for c in [key, *table_columns] if c not in names]
        if absent:
            raise EvaluationError(f"{path}: slice column(s) {absent} not in the table ({names})")
        table = pq.read_table(path, columns=[key, *table_columns]).to_pydict()
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
    record = _smoke_record(run_model(registry.version_dir(version) / "model", features), keys, k)
    if record is None:
        raise EvaluationError(
            f"version {version}: the model has neither a 'class_id' nor a 'predictions' output"
        )
    output, key = next((o, f) for o, f in SMOKE_OUTPUTS.items() if f in record)
    return SmokeExamples(keys, features, {output: record[key]})
