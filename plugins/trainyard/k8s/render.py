"""``python -m trainyard render <pipeline>``: a pipeline's Kubernetes objects as YAML."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from trainyard.errors import ConfigError
from trainyard.k8s.checks import render_yaml, validate_object
from trainyard.k8s.objects import (
    VOLUME_ROOT,
    dataset_pvc,
    models_pvc,
    serving_deployment,
    serving_service,
    step_pod,
    training_base_name,
    training_objects,
)
from trainyard.k8s.profile import load_cluster_profile

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.k8s.profile import ClusterProfile

TRAINER_CONTRACTS_DIR = "/opt/trainyard/data_contracts"
"""Where images/trainer/Dockerfile puts the data contracts."""
RENDER_STEPS = ("storage", "stage", "validate", "train", "evaluate", "deploy", "all")


def trainer_args(pipeline: PipelineConfig, snapshot: str, run_name: str) -> list[str]:
    """Arguments of ``python -m trainyard.training.worker`` for a training Job.

    Args:
        pipeline: The pipeline config.
        snapshot: Snapshot id to train on.
        run_name: Attempt base name (checkpoint and output folder).

    Returns:
        Paths under ``/volumes`` (and the contract baked into the trainer image) plus the
        training parameters.
    """
    t = pipeline.training
    ckpt = f"{VOLUME_ROOT}/_checkpoints/{pipeline.name}/{run_name}"
    return [
        "--snapshot-dir", f"{VOLUME_ROOT}/{pipeline.dataset}/snapshots/{snapshot}",
        "--contract", f"{TRAINER_CONTRACTS_DIR}/{pipeline.dataset}.yaml",
        "--model", t.model,
        "--strategy", t.strategy,
        "--epochs", str(t.epochs),
        "--batch-size", str(t.batch_size),
        "--learning-rate", str(t.learning_rate),
        "--steps-per-execution", str(t.steps_per_execution),
        "--seed", str(t.seed),
        "--checkpoint-dir", f"{ckpt}/backup",
        "--output-dir", f"{ckpt}/output",
    ]  # fmt: skip


def pipeline_training_objects(
    profile: ClusterProfile,
    pipeline: PipelineConfig,
    run_id: str,
    args: list[str],
    kueue: bool | None = None,
) -> Any:
    """``training_objects`` with the pipeline's strategy, replicas, tier, GPUs and deadline.

    Args:
        profile: Cluster profile.
        pipeline: Pipeline config.
        run_id: Names the attempt (Service, Jobs).
        args: Trainer arguments.
        kueue: Kueue mode; default from the profile.

    Returns:
        The ``TrainingObjects`` of one attempt.
    """
    t = pipeline.training
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


def render_objects(
    profile: ClusterProfile,
    pipeline: PipelineConfig,
    step: str = "all",
    *,
    snapshot: str | None = None,
    version: int | None = None,
    run_id: str = "manual",
    kueue: bool | None = None,
) -> list[Any]:
    """The objects of one step (or all) of a pipeline, in apply order.

    Args:
        profile: Cluster profile.
        pipeline: Pipeline config.
        step: One of ``RENDER_STEPS``.
        snapshot: Snapshot id (validate, train).
        version: Model version (evaluate, deploy).
        run_id: Airflow run id (names the training attempt).
        kueue: Kueue mode; default from the profile.

    Returns:
        Typed objects.

    Raises:
        ConfigError: If the step is unknown or a needed id is missing.
    """
    if step not in RENDER_STEPS:
        raise ConfigError(f"unknown render step {step!r} (known: {', '.join(RENDER_STEPS)})")

    def need(value: Any, option: str, for_step: str) -> Any:
        if value is None:
            raise ConfigError(f"render {for_step}: {option} is required")
        return value

    name, ds = pipeline.name, pipeline.dataset
    steps = RENDER_STEPS[:-1] if step == "all" else (step,)
    objs: list[Any] = []
    for s in steps:
        if s == "storage":
            st = pipeline.staging
            objs += [
                dataset_pvc(profile, ds, st.pvc_size, st.storage_class, st.access_mode),
                models_pvc(profile),
            ]
        elif s == "stage":
            objs.append(step_pod(profile, "stage", ["--pipeline", name], ds))
        elif s == "validate":
            snap = need(snapshot, "--snapshot", s)
            objs.append(step_pod(profile, "validate", ["--pipeline", name, "--snapshot", snap], ds))
        elif s == "train":
            snap = need(snapshot, "--snapshot", s)
            base = training_base_name(name, run_id)
            tr = pipeline_training_objects(
                profile, pipeline, run_id, trainer_args(pipeline, snap, base), kueue=kueue
            )
            objs += [tr.service, *tr.jobs]
        elif s == "evaluate":
            ver = need(version, "--version", s)
            objs.append(
                step_pod(profile, "evaluate", ["--pipeline", name, "--version", str(ver)], ds)
            )
        elif s == "deploy":
            ver = need(version, "--version", s)
            sv = pipeline.serving
            objs += [
                serving_deployment(profile, sv.model_name, ver, sv.replicas),
                serving_service(profile, sv.model_name),
                step_pod(profile, "deploy", ["--pipeline", name, "--version", str(ver)], ds),
            ]
    return objs


def cli_main(argv: list[str]) -> int:
    """``render <pipeline> [--step S] [--snapshot ID] [--version N] [--profile F] [--kueue]``.

    Prints the validated YAML on stdout.

    Args:
        argv: Arguments after ``render``.

    Returns:
        0 on success.

    Raises:
        ConfigError: If the pipeline or profile is invalid, or a rendered object fails the
            schema or Pod Security check (every message listed).
    """
    from trainyard.config import load_pipeline

    p = argparse.ArgumentParser(prog="python -m trainyard render")
    p.add_argument("pipeline")
    p.add_argument("--step", choices=RENDER_STEPS, default="all")
    p.add_argument("--snapshot", help="snapshot id (validate, train)")
    p.add_argument("--version", type=int, help="model version (evaluate, deploy)")
    p.add_argument("--run-id", default="manual")
    p.add_argument("--profile", help="cluster profile YAML (default: settings)")
    p.add_argument("--kueue", action=argparse.BooleanOptionalAction, default=None)
    a = p.parse_args(argv)
    profile = load_cluster_profile(a.profile)
    pipeline = load_pipeline(a.pipeline)
    objs = render_objects(
        profile,
        pipeline,
        a.step,
        snapshot=a.snapshot,
        version=a.version,
        run_id=a.run_id,
        kueue=a.kueue,
    )
    errors = [e for o in objs for e in validate_object(o)]
    if errors:
        raise ConfigError("rendered objects are invalid:\n  " + "\n  ".join(errors))
    sys.stdout.write(render_yaml(objs))
    return 0
