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
from trainyard.evaluation.gate import (
    ForceRequest,
    GateDecision,
    LineageScore,
    decide,
    keep,
    required_metrics,
)
from trainyard.evaluation.metrics import (
    ExamplesLike,
    diagnostics,
    metrics_with_slices,
    run_model,
    select_slices,
)

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.registry import Registry

log = logging.getLogger("trainyard.evaluation")


@dataclass(frozen=True)
class Score:
    """One model on one holdout: what the gate reads of it.

    Attributes:
        metrics: Overall and per-slice metrics (``accuracy@label=3``).
        smoke: The leading rows' keys and predictions (:func:`_smoke_record`).
        diagnostics: Confusion matrix or residuals (:func:`diagnostics`).
        seconds: Time it took to score (0 when it came from the cache).
        cached: It came from the registry's score cache (same model, same holdout).
        error: Why it could not be scored (then it has no metrics).
    """

    metrics: dict[str, float]
    smoke: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    seconds: float = 0.0
    cached: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """What the score cache keeps."""
        return {"metrics": self.metrics, "smoke": self.smoke, "diagnostics": self.diagnostics}


def score_model(
    model_dir: Path | str,
    examples: ExamplesLike,
    metrics: Sequence[str],
    slice_values: Mapping[str, np.ndarray],
    smoke_rows: int = 8,
) -> Score:
    """Run a SavedModel over the holdout and compute what the gate reads.

    Raises:
        EvaluationError: If the model cannot be loaded or run, or the inputs do not fit.
    """
    t0 = time.monotonic()
    outputs = run_model(model_dir, examples.features)
    return Score(
        metrics_with_slices(outputs, examples.labels, examples.keys, metrics, slice_values),
        _smoke_record(outputs, examples.keys, smoke_rows),
        diagnostics(outputs, examples.labels),
        round(time.monotonic() - t0, 3),
    )


def gate_scores(
    gate: GateConfig,
    candidate: Score | str,
    champion: Score | str | None,
    force: ForceRequest | None = None,
    *,
    data_times: tuple[str | None, str | None] | None = None,
    not_compared: str | None = None,
    lineage: Sequence[tuple[int, Score]] = (),
) -> GateDecision:
    """``decide`` on scores; a model that could not be scored (its error) is a failed check.

    Args:
        gate: The pipeline's gate.
        candidate: The candidate's score, or why it could not be scored.
        champion: The champion's score, why it could not be scored (or even located), or
            None (no champion to compare with).
        force: A force-promote request.
        data_times: Candidate's and champion's newest data (see :func:`decide`).
        not_compared: Why the champion is not evaluated at all (see :func:`decide`).
        lineage: ``(version, score)`` of the versions served before.

    Returns:
        The decision, with the candidate's smoke rows and diagnostics, and the timings.
    """

    def error(score: Score | str | None) -> str | None:
        return score if isinstance(score, str) else score.error if score else None

    cand = candidate if isinstance(candidate, Score) and not candidate.error else None
    champ = champion if isinstance(champion, Score) and not champion.error else None
    timings: dict[str, float] = {}
    if isinstance(candidate, Score):
        timings["candidate_seconds"] = candidate.seconds
    if isinstance(champion, Score):
        timings["champion_seconds"] = champion.seconds
    scored = [s for _, s in lineage if isinstance(s, Score)]
    if scored:
        timings["lineage_seconds"] = round(sum(s.seconds for s in scored), 3)
    cached = sum(1 for s in (candidate, champion, *scored) if isinstance(s, Score) and s.cached)
    if cached:
        timings["cached"] = cached
    decision = decide(
        gate,
        cand.metrics if cand else {},
        champ.metrics if champ else None,
        force,
        candidate_error=error(candidate),
        champion_error=error(champion),
        data_times=data_times,
        not_compared=not_compared,
        lineage=[LineageScore(v, {} if s.error else s.metrics, s.error) for v, s in lineage],
    )
    return dataclasses.replace(
        decision,
        smoke=cand.smoke if cand else None,
        timings=timings,
        diagnostics=cand.diagnostics if cand else None,
    )


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

    def score(model_dir: Path | str, who: str) -> Score:
        t0 = time.monotonic()
        try:
            values = select_slices(gate.slices, slice_values)
            return score_model(model_dir, examples, metrics, values, smoke_rows)
        except Exception as e:  # any failure means the gate cannot decide: reject with it
            log.exception("evaluating %s %s failed", who, model_dir)
            why = f"{who} evaluation failed: {type(e).__name__}: {e}"
            return Score({}, seconds=round(time.monotonic() - t0, 3), error=why)

    candidate = score(candidate_dir, "candidate")
    champion: Score | str | None = champion_error
    if champion_dir is not None and champion_error is None:
        champion = score(champion_dir, "champion")
    return gate_scores(
        gate, candidate, champion, force, data_times=data_times, not_compared=not_compared
    )


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

    contract = load_contract(cfg.dataset)
    dirs = _checked_window(meta)
    return dirs, contract, load_window_examples(dirs, contract, "holdout")


def _checked_window(meta: Mapping[str, Any]) -> list[Path]:
    """A version's window folders, each checked against its manifest (``SnapshotError``)."""
    from trainyard.volumes import check_snapshot

    dirs = window_dirs(meta)
    for d in dirs:
        check_snapshot(d)
    return dirs


def _task_of(registry: Registry, version: int) -> str | None:
    """The task a version was trained for (versions before task types: classification)."""
    try:
        return (registry.read_file(version, "metrics.json") or {}).get("task", "classification")
    except TrainyardError:  # unreadable: evaluating it will say what is wrong
        return None


class _Scores:
    """Every version the gate reads, scored on the candidate's holdout, through the cache.

    A version's score is kept under the fingerprint of what it depends on (the version,
    the holdout's snapshot ids, the contract, the metrics and slices, the code): a run on
    unchanged data scores nothing again and loads no model.
    """

    def __init__(
        self, cfg: PipelineConfig, registry: Registry, gate: GateConfig, meta: Mapping[str, Any]
    ) -> None:
        from trainyard.contracts import load_contract
        from trainyard.fingerprint import code_identity, contract_digest

        self.cfg, self.registry, self.gate = cfg, registry, gate
        self.metrics = required_metrics(gate)
        contract = load_contract(cfg.dataset)
        read = meta.get("snapshots") or [{"snapshot_id": meta["snapshot_id"]}]
        self.common = {
            "holdout": [str(r.get("snapshot_id")) for r in read if isinstance(r, Mapping)],
            "contract": {"version": contract.version, "digest": contract_digest(contract)},
            "metrics": sorted(self.metrics),
            "slices": list(gate.slices),
            "smoke_rows": cfg.serving.smoke_rows,
            "code": code_identity(),
        }
        self.meta = meta
        self.examples: ExamplesLike | None = None
        self.slice_values: dict[str, np.ndarray] = {}

    def key(self, version: int) -> str:
        """The digest a version's score on this holdout is kept under."""
        from trainyard.fingerprint import fingerprint

        meta = self.registry.metadata(version)
        model = {
            "pipeline": self.registry.pipeline,
            "version": version,
            "registered_at": meta.get("registered_at"),
            "run_id": meta.get("run_id"),
        }
        return fingerprint("evaluate", {"model": model, **self.common}).digest

    def cached(self, version: int) -> bool:
        """Whether the version's score on this holdout is in the cache."""
        return self.registry.cached_scores(self.key(version)) is not None

    def load(self) -> None:
        """Load the holdout (its snapshots checked first) and the slice columns."""
        dirs, contract, self.examples = _holdout(self.cfg, self.meta)
        self.slice_values = _slice_values(dirs, contract, self.examples, self.gate.slices)

    def score(self, version: int, who: str) -> Score:
        """The version's score (cached, or computed and kept), or why it has none."""
        t0 = time.monotonic()
        try:
            key = self.key(version)
            kept = self.registry.cached_scores(key)
            if kept is not None and isinstance(kept.get("metrics"), dict):
                return Score(kept["metrics"], kept.get("smoke"), kept.get("diagnostics"), 0.0, True)
            if self.examples is None:
                self.load()
            assert self.examples is not None
            values = select_slices(self.gate.slices, self.slice_values)
            model = self.registry.version_dir(version) / "model"
            score = score_model(
                model, self.examples, self.metrics, values, self.cfg.serving.smoke_rows
            )
            self.registry.keep_scores(key, score.to_dict())
            return score
        except Exception as e:  # the gate cannot decide on this model: it rejects, and says so
            log.exception("evaluating %s v%s of %s failed", who, version, self.cfg.name)
            why = f"{who} evaluation failed: {type(e).__name__}: {e}"
            return Score({}, seconds=round(time.monotonic() - t0, 3), error=why)


def evaluate_and_decide(
    cfg: PipelineConfig, registry: Registry, version: int, force: ForceRequest | None = None
) -> GateDecision:
    """The evaluate step: gate a registered candidate and attach ``gate.md``/``gate.json``.

    Candidate, champion and every version served before (the lineage: promoted or rolled
    back to, :meth:`Registry.served_versions`) are scored on the holdout split of the
    snapshots the candidate was trained on (every snapshot of its training window, each
    split by its stable key hash); scores are cached by their fingerprint (same version,
    same holdout, same code), so an unchanged run loads no model. Anything that stops the
    gate from deciding (missing data, an unreadable champion pointer or history, a crashing
    model) becomes a failed check: the verdict is ``reject``.

    A candidate that is the champion (a run that reused the version trained on its inputs)
    is checked the same way, against the lineage, and kept: the verdict is ``keep``,
    nothing is deployed, and its own gate record is left as it was when it shipped.

    Args:
        cfg: The pipeline config (its ``gate`` and ``serving.smoke_rows``).
        registry: The pipeline's registry.
        version: The candidate version.
        force: A force-promote request.

    Returns:
        The decision (also stored next to the model, unless it is ``keep``).

    Raises:
        RegistryError: If the candidate version does not exist.
    """
    from trainyard.contracts import load_contract

    meta = registry.metadata(version)
    task = load_contract(cfg.dataset).roles.task
    gate = cfg.gate.for_task(task)
    champion_version: int | None = None
    champion_error = None
    served: list[int] = []
    try:
        champion_version = registry.champion()
        served = registry.served_versions()
    except TrainyardError as e:
        champion_error = f"champion unreadable: {e}"
    kept = champion_version == version
    champion_time = None
    if champion_version is not None and not kept:
        try:
            champion_time = newest_data(registry.metadata(champion_version))
        except TrainyardError as e:
            log.warning("champion v%s: data time unknown: %s", champion_version, e)
    data_times = (newest_data(meta), champion_time)
    not_compared = None
    if champion_version is not None and not kept:
        champion_task = _task_of(registry, champion_version) or task
        if champion_task != task:
            # versions trained before task types were all classifiers
            not_compared = (
                f"champion v{champion_version} is a {champion_task} model and the "
                f"contract's task is now {task}"
            )
    lineage_versions = [
        v
        for v in served
        if v not in (version, champion_version) and _task_of(registry, v) in (task, None)
    ]
    scores = _Scores(cfg, registry, gate, meta)
    compare_champion = champion_version is not None and not kept and not not_compared
    wanted = [version, *([champion_version] if compare_champion else []), *lineage_versions]
    try:
        _checked_window(meta)
        if not all(scores.cached(v) for v in wanted if v is not None):
            scores.load()
    except Exception as e:  # no holdout data means no decision: reject with the reason
        log.exception("loading the holdout of %s v%s failed", cfg.name, version)
        if champion_version is not None and champion_error is None and not kept:
            champion_error = "not evaluated (no holdout data)"
        decision = decide(
            gate,
            {},
            None,
            force,
            candidate_error=f"holdout data unavailable: {type(e).__name__}: {e}",
            champion_error=champion_error,
            data_times=None if kept else data_times,
        )
    else:
        champion: Score | str | None = champion_error
        if compare_champion and champion_error is None:
            assert champion_version is not None
            champion = scores.score(champion_version, "champion")
        decision = gate_scores(
            gate,
            scores.score(version, "candidate"),
            None if kept else champion,
            None if kept else force,
            data_times=None if kept else data_times,
            not_compared=not_compared,
            lineage=[
                (v, scores.score(v, f"version {v} (served before)")) for v in lineage_versions
            ],
        )
    if kept:
        return keep(decision, version)
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
