"""The contract between whoever starts training workers and the workers: written once.

A worker is ``python -m trainyard worker <args>`` (:data:`WORKER_COMMAND`); its arguments
come from :func:`worker_args` and its environment names are the constants below. The
Kubernetes builders put both into every training Job's container; the local runner runs
those very containers as processes, adding only :data:`ENV_HOSTS` (the headless Service's
DNS names mapped to loopback ports), :data:`ENV_PARENT_PID` and :data:`ENV_ATTEMPT`.
No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from trainyard.layout import Layout

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig, TrainingConfig

WORKER_COMMAND = ("python", "-m", "trainyard", "worker")
"""The container command of every training pod (one entry of the step table)."""

ENV_TASK_TYPE = "TRAINYARD_TF_TASK_TYPE"
"""``worker`` | ``chief`` | ``ps``: the role of the Job the pod belongs to."""
ENV_JOBS = "TRAINYARD_TF_JOBS"
"""JSON ``{"worker": {"job": <Job name>, "replicas": n}, ...}`` of the attempt."""
ENV_SERVICE = "TRAINYARD_TF_SERVICE"
"""The headless Service (the pods' subdomain)."""
ENV_PORT = "TRAINYARD_TF_PORT"
"""The port every task listens on (2222 in pods)."""
ENV_INDEX = "JOB_COMPLETION_INDEX"
"""Set by Kubernetes for each pod of an Indexed Job; the task index."""
ENV_HOSTS = "TRAINYARD_TF_HOSTS"
"""Local runner only: JSON ``{"<pod>.<service>": "127.0.0.1:<port>"}`` (DNS → loopback)."""
ENV_BIND = "TRAINYARD_TF_BIND"
"""Local runner only: the interface the worker's gRPC server must listen on."""
ENV_PARENT_PID = "TRAINYARD_PARENT_PID"
"""Local runner only: the launcher's pid; the worker exits when it dies."""
ENV_ATTEMPT = "TRAINYARD_ATTEMPT"
"""1-based attempt number (a retry of the whole set of workers)."""
ENV_FAULT = "TRAINYARD_FAULT"
"""Tests: a fault to inject (``training/worker/main.py``)."""

TENSORBOARD_DIR = "tensorboard"
"""The chief's TensorBoard event files, in the output and then in the version."""

IMAGE_CONTRACTS_DIR = "/opt/trainyard/data_contracts"
"""Where ``images/trainer/Dockerfile`` puts the data contracts."""


@dataclass(frozen=True)
class RunPaths:
    """Where one training run reads and writes, below a volume root.

    Attributes:
        snapshots: The snapshots it trains on (its training window, oldest first).
        checkpoints: ``BackupAndRestore`` folder (survives attempts).
        output: The chief's SavedModel, metrics, history and the snapshots it read
            (``inputs.json``); ``register`` takes it.
    """

    snapshots: tuple[PurePath, ...]
    checkpoints: PurePath
    output: PurePath

    @property
    def snapshot(self) -> PurePath:
        """The run's own snapshot (the newest of the window)."""
        return self.snapshots[-1]


def run_paths(
    layout: Layout, pipeline: PipelineConfig, snapshot_ids: str | Sequence[str], run_id: str
) -> RunPaths:
    """The paths of a training run on a volume root (``/volumes`` in pods, local root here).

    Args:
        layout: The volume layout.
        pipeline: The pipeline config.
        snapshot_ids: The snapshot to train on, or every snapshot of the run's training
            window (the run's own last).
        run_id: The run (any Airflow run id).

    Returns:
        Snapshot, checkpoint and output folders.
    """
    ids = [snapshot_ids] if isinstance(snapshot_ids, str) else list(dict.fromkeys(snapshot_ids))
    base = layout.checkpoints(pipeline.name, run_id)
    return RunPaths(
        snapshots=tuple(layout.snapshot(pipeline.dataset, sid) for sid in ids),
        checkpoints=base / "backup",
        output=base / "output",
    )


def worker_args(paths: RunPaths, contract: PurePath | str, training: TrainingConfig) -> list[str]:
    """Arguments of the worker command (after :data:`WORKER_COMMAND`).

    Args:
        paths: The run's folders.
        contract: The dataset's contract file as the worker sees it.
        training: The run's effective training config.

    Returns:
        The argument list, every flag with its value.
    """
    t = training
    return [
        *(a for snap in paths.snapshots for a in ("--snapshot-dir", str(snap))),
        "--contract", str(contract),
        "--model", t.model,
        "--strategy", t.strategy,
        "--epochs", str(t.epochs),
        "--batch-size", str(t.batch_size),
        "--learning-rate", repr(float(t.learning_rate)),
        "--steps-per-execution", str(t.steps_per_execution),
        "--seed", str(t.seed),
        "--checkpoint-dir", str(paths.checkpoints),
        "--output-dir", str(paths.output),
    ]  # fmt: skip
