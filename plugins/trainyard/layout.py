"""Every path on a volume, named in one place.

Nothing else in trainyard joins path strings for the volumes: the steps, the local runner,
the Kubernetes builders (whose pods see the same layout under ``/volumes``) and the
training launcher all ask a :class:`Layout`. Names that come from a config or from a run
(dataset, pipeline, model name, snapshot id, run id) are checked here, so none of them can
reach outside its folder (``..``, ``.``, ``/``, NUL, over-long)::

    <root>/<dataset>/snapshots/<snapshot-id>/    immutable snapshot (manifest.json, shards)
    <root>/<dataset>/intervals/<interval>.json   which snapshot a data interval produced
    <root>/<dataset>/validated.json              the latest validated snapshot + history
    <root>/<dataset>/leases/                     snapshots a running training reads
    <root>/<dataset>/.tmp/                       private in-progress writes
    <root>/_models/<pipeline>/versions/<n>/      registered versions
    <root>/_models/<pipeline>/champion.json      the served version
    <root>/_models/<pipeline>/runs/<run>.json    run records (summary)
    <root>/_models/<pipeline>/scores/<digest>.json  a version's scores on a holdout (a cache)
    <root>/_models/<pipeline>/.work/<run>/       a training run's output before register
    <root>/_checkpoints/<pipeline>/<run>/        BackupAndRestore checkpoints of a run (removed
                                                 at register; a week untouched, by another's)
    <root>/_serving/<model-name>/<n>/            TF Serving base path of a model
    <root>/_serving/<model-name>/model.config    which of its versions are served (labels)
    <root>/_serving/models.config                every model's entry (TF Serving's file)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Generic, TypeVar

from trainyard.errors import ConfigError

P = TypeVar("P", bound=PurePath)

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""A name that may be one path component: starts alphanumeric, no ``/``, at most 100."""
INTERVAL_KEY = re.compile(r"^[0-9A-Za-z+_-]{1,200}$")
"""What ``volumes.interval_key`` makes of an interval: no ``/``, no ``.``."""
MODELS_DIR = "_models"
SERVING_DIR = "_serving"
CHECKPOINTS_DIR = "_checkpoints"
RESERVED = (MODELS_DIR, SERVING_DIR, CHECKPOINTS_DIR)
VERSIONS_DIR = "versions"
CHAMPION_FILE = "champion.json"
HISTORY_FILE = "history.jsonl"
SCORES_DIR = "scores"
"""A pipeline's registry folder: ``versions/<n>/``, the champion pointer, its history."""
"""Top-level folders of the models volume; no dataset may be called so."""


def safe_name(kind: str, value: object) -> str:
    """``value`` if it can be one path component, else a ``ConfigError`` naming it.

    Args:
        kind: What the value is (``dataset``, ``run id``, ...), for the error.
        value: The name.

    Returns:
        The name, unchanged.

    Raises:
        ConfigError: If it is not a string matching :data:`SAFE_NAME` (so never ``.``,
            ``..``, empty, or containing a separator).
    """
    if not isinstance(value, str) or not SAFE_NAME.match(value) or value in (".", ".."):
        raise ConfigError(
            f"{kind} {value!r} is not a safe name: use 1-100 letters, digits, '_', '-' "
            "or '.', starting with a letter or digit"
        )
    return value


def run_key(run_id: str) -> str:
    """A path component for any Airflow run id, distinct for distinct run ids.

    Airflow run ids carry ``:`` and ``+`` (``manual__2026-11-22T02:18:41+00:00``); the
    key keeps their readable characters and appends a hash of the whole id, so two run
    ids never share a folder and ``.`` or ``..`` become ordinary names.

    Args:
        run_id: The run id (any text, not empty).

    Returns:
        ``<readable prefix>-<hash8>``.

    Raises:
        ConfigError: If the run id is empty or not a string.
    """
    if not isinstance(run_id, str) or not run_id or "\x00" in run_id:
        raise ConfigError(f"run id {run_id!r} must be non-empty text")
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("._-")[:60] or "run"
    digest = hashlib.blake2b(run_id.encode(), digest_size=4).hexdigest()
    return f"{readable}-{digest}"


@dataclass(frozen=True)
class Layout(Generic[P]):
    """The folders of one volume root (a local ``Path`` or a pod's ``PurePosixPath``).

    Attributes:
        root: The volume root (``TRAINYARD_VOLUME_ROOT`` locally, ``/volumes`` in pods).
    """

    root: P

    # ------------------------------------------------------------------ datasets
    def dataset(self, dataset: str) -> P:
        """The dataset's volume."""
        name = safe_name("dataset", dataset)
        if name in RESERVED:
            raise ConfigError(f"dataset {dataset!r} is a reserved folder name ({RESERVED})")
        return self.root / name  # type: ignore[return-value]

    def snapshots(self, dataset: str) -> P:
        """The dataset's published snapshots."""
        return self.dataset(dataset) / "snapshots"  # type: ignore[return-value]

    def snapshot(self, dataset: str, snapshot_id: str) -> P:
        """One snapshot of a dataset."""
        return self.snapshots(dataset) / safe_name("snapshot id", snapshot_id)  # type: ignore[return-value]

    def intervals(self, dataset: str) -> P:
        """Interval records of a dataset."""
        return self.dataset(dataset) / "intervals"  # type: ignore[return-value]

    def interval(self, dataset: str, key: str) -> P:
        """The record of one data interval (``key`` from :func:`interval_key`)."""
        if not isinstance(key, str) or not INTERVAL_KEY.match(key):
            raise ConfigError(f"interval key {key!r} is not one interval_key() makes")
        return self.intervals(dataset) / f"{key}.json"  # type: ignore[return-value]

    def validated(self, dataset: str) -> P:
        """The dataset's latest validated snapshot and its history."""
        return self.dataset(dataset) / "validated.json"  # type: ignore[return-value]

    def leases(self, dataset: str) -> P:
        """Lease files of the snapshots running trainings read."""
        return self.dataset(dataset) / "leases"  # type: ignore[return-value]

    def tmp(self, dataset: str) -> P:
        """Private in-progress writes of a dataset's volume."""
        return self.dataset(dataset) / ".tmp"  # type: ignore[return-value]

    # ------------------------------------------------------------------ models
    @property
    def models_root(self) -> P:
        """Root of the models volume's registry."""
        return self.root / MODELS_DIR  # type: ignore[return-value]

    def models(self, pipeline: str) -> P:
        """A pipeline's registry folder."""
        return self.models_root / safe_name("pipeline", pipeline)  # type: ignore[return-value]

    def version(self, pipeline: str, version: int) -> P:
        """One registered version."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigError(f"model version {version!r} must be a positive integer")
        return self.models(pipeline) / VERSIONS_DIR / str(version)  # type: ignore[return-value]

    def runs(self, pipeline: str) -> P:
        """A pipeline's run records."""
        return self.models(pipeline) / "runs"  # type: ignore[return-value]

    def run_record(self, pipeline: str, run_id: str) -> P:
        """The record of one run (``trainyard summary``)."""
        return self.runs(pipeline) / f"{run_key(run_id)}.json"  # type: ignore[return-value]

    def run_failure(self, pipeline: str, run_id: str) -> P:
        """Why a run's step failed (the step task writes it; its page and note say it)."""
        return self.runs(pipeline) / f"{run_key(run_id)}.failed.json"  # type: ignore[return-value]

    def last_run(self, pipeline: str) -> P:
        """The record of the pipeline's last run."""
        return self.models(pipeline) / "last_run.json"  # type: ignore[return-value]

    def work(self, pipeline: str, run_id: str) -> P:
        """A training run's output folder until ``register`` takes it."""
        return self.models(pipeline) / ".work" / run_key(run_id)  # type: ignore[return-value]

    def checkpoints(self, pipeline: str, run_id: str) -> P:
        """A training run's ``BackupAndRestore`` folder."""
        name = safe_name("pipeline", pipeline)
        return self.root / CHECKPOINTS_DIR / name / run_key(run_id)  # type: ignore[return-value]

    # ------------------------------------------------------------------ serving
    @property
    def serving_root(self) -> P:
        """Root of every model's serving base path."""
        return self.root / SERVING_DIR  # type: ignore[return-value]

    def serving_base(self, model_name: str) -> P:
        """TF Serving's base path of one model (numeric version folders below)."""
        return self.serving_root / safe_name("serving model name", model_name)  # type: ignore[return-value]
