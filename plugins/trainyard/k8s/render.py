"""A pipeline run's training objects: the Service and Indexed Jobs both runners start.

The kubernetes runner submits them; the local runner runs each of their pods as a process
(:func:`trainyard.training.launcher.run_training`). Step pods come from the step table
(:mod:`trainyard.pods`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from trainyard.errors import ConfigError
from trainyard.k8s.objects import VOLUME_ROOT, TrainingObjects, training_objects
from trainyard.k8s.profile import training_problems
from trainyard.layout import Layout
from trainyard.training import spec

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig, TrainingConfig
    from trainyard.k8s.profile import ClusterProfile


def pipeline_training_objects(
    profile: ClusterProfile,
    pipeline: PipelineConfig,
    run_id: str,
    args: list[str],
    kueue: bool | None = None,
) -> TrainingObjects:
    """``training_objects`` with the pipeline's strategy, replicas, tier, GPUs and deadline.

    Args:
        profile: Cluster profile.
        pipeline: Pipeline config.
        run_id: Names the attempt (Service, Jobs).
        args: Trainer arguments.
        kueue: Kueue mode; default from the profile.

    Returns:
        The ``TrainingObjects`` of one attempt.

    Raises:
        ConfigError: Every problem :func:`~trainyard.k8s.profile.training_problems` finds.
    """
    t = pipeline.training
    problems = training_problems(profile, t, kueue=kueue)
    if problems:
        raise ConfigError(
            "; ".join(
                f"pipeline {pipeline.name}: training.{'.'.join(k)}: {why}" for k, why in problems
            )
        )
    return training_objects(
        profile,
        pipeline.name,
        run_id,
        strategy=t.strategy,
        workers=t.workers,
        parameter_servers=t.parameter_servers,
        tier=t.priority,
        gpus_per_worker=t.gpus_per_worker,
        args=args,
        dataset=pipeline.dataset,
        deadline_s=t.attempt_timeout_s,
        kueue=kueue,
    )


def run_training_objects(
    profile: ClusterProfile,
    pipeline: PipelineConfig,
    training: TrainingConfig,
    snapshot_id: str,
    run_id: str,
    kueue: bool | None = None,
    window: Sequence[str] | None = None,
) -> TrainingObjects:
    """The Service and Jobs of one run, rendered with the run's training config.

    Their names derive from the pipeline and the run id, so a retry of the same run finds
    (and reattaches to) the Jobs it already created.

    Args:
        profile: Cluster profile.
        pipeline: The pipeline config.
        training: The run's effective training config (trigger form over the pipeline's).
        snapshot_id: Snapshot the run trains on.
        run_id: The run.
        kueue: Kueue mode; default from the profile.
        window: Every snapshot of the run's training window (``validate``'s); each is a
            ``--snapshot-dir`` of the worker command. Default: ``snapshot_id`` alone.

    Returns:
        The run's objects, placement plan and teardown.

    Raises:
        ConfigError: If the config cannot be rendered (unknown tier, no parameter server).
    """
    run_cfg = pipeline.model_copy(update={"training": training})
    ids = [*(s for s in window or () if s != snapshot_id), snapshot_id]
    paths = spec.run_paths(Layout(PurePosixPath(VOLUME_ROOT)), pipeline, ids, run_id)
    contract = PurePosixPath(spec.IMAGE_CONTRACTS_DIR) / f"{pipeline.dataset}.yaml"
    args = spec.worker_args(paths, contract, training)
    return pipeline_training_objects(profile, run_cfg, run_id, args, kueue=kueue)
