"""Each step of the table as the pod the cluster runs, and ``python -m trainyard render``.

:func:`step_pod` is the one place a step becomes a pod: its container command is
``python -m trainyard <step>`` and its arguments are the step table's
(:meth:`trainyard.steps.Step.argv`), so every pod runs a command the CLI has. Both runners
use it: the kubernetes runner submits the pod, the local runner runs its container as a
process (:mod:`trainyard.k8s.local`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from trainyard import argtypes
from trainyard.errors import ConfigError
from trainyard.k8s import checks, objects
from trainyard.k8s.profile import load_cluster_profile
from trainyard.k8s.render import run_training_objects
from trainyard.steps import STEPS, training_params

if TYPE_CHECKING:
    from kubernetes.client import V1Pod

    from trainyard.config import PipelineConfig
    from trainyard.k8s.profile import ClusterProfile

RENDER_STEPS = ("storage", *STEPS, "scorer", "all")


def step_pod(
    profile: ClusterProfile,
    pipeline: PipelineConfig,
    step: str,
    values: dict[str, Any],
    env: dict[str, str] | None = None,
    run_id: str | None = None,
) -> V1Pod:
    """The pod of one step of the table, for one set of argument values.

    Args:
        profile: Cluster profile.
        pipeline: The pipeline config (its dataset's volume is mounted).
        step: A key of :data:`trainyard.steps.STEPS`.
        values: The step's arguments (``pipeline`` is filled in).
        env: Extra environment variables of the container.
        run_id: The Airflow run the pod is for (its ``trainyard.io/run`` label).

    Returns:
        The restricted pod, named after the pipeline, running ``python -m trainyard <step> <args>``.

    Raises:
        ConfigError: On an unknown step, unknown argument or missing required one.
    """
    if step not in STEPS:
        raise ConfigError(f"unknown step {step!r} (known: {', '.join(STEPS)})")
    table = STEPS[step]
    args = table.argv({"pipeline": pipeline.name, **values})
    return objects.step_pod(
        profile,
        step,
        args,
        pipeline.dataset,
        pipeline=pipeline.name,
        run_id=run_id,
        writes_dataset=table.writes_dataset,
        env=env,
    )


SAMPLE_VALUES: dict[str, dict[str, Any]] = {
    "stage": {"interval_start": "2026-11-01", "interval_end": "2026-11-02"},
    "validate": {"snapshot_id": "{snapshot}", "interval_start": "2026-11-01"},
    "plan": {"snapshot_id": "{snapshot}", "overrides": {}, "force_retrain": False},
    "train": {"snapshot_id": "{snapshot}", "run_id": "{run_id}", "overrides": {}},
    "register": {
        "snapshot_id": "{snapshot}",
        "run_id": "{run_id}",
        "training": {},
        "seconds": 1.0,
        "attempts": 1,
    },
    "evaluate": {"version": "{version}", "force_promote": False, "actor": "render"},
    "deploy": {"version": "{version}", "actor": "render"},
    "approval": {"version": "{version}", "decision": "pending", "run_id": "{run_id}"},
    "summary": {"run_id": "{run_id}", "results": {}},
}
"""Argument values ``render`` fills in for each step (ids from its options)."""


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
        step: One of :data:`RENDER_STEPS`.
        snapshot: Snapshot id (steps that take one).
        version: Model version (steps that take one).
        run_id: The run (names the training attempt; labels every pod).
        kueue: Kueue mode; default from the profile.

    Returns:
        Typed objects.

    Raises:
        ConfigError: If the step is unknown or a needed id is missing.
    """
    if step not in RENDER_STEPS:
        raise ConfigError(f"unknown render step {step!r} (known: {', '.join(RENDER_STEPS)})")
    ids = {"{snapshot}": snapshot, "{version}": version, "{run_id}": run_id}
    options = {"{snapshot}": "--snapshot", "{version}": "--version", "{run_id}": "--run-id"}

    def fill(name: str, value: Any) -> Any:
        if isinstance(value, str) and value in ids:
            if ids[value] is None:
                raise ConfigError(f"render {name}: {options[value]} is required")
            return ids[value]
        return value

    wanted = RENDER_STEPS[:-1] if step == "all" else (step,)
    out: list[Any] = []
    for s in wanted:
        if s == "storage":
            st = pipeline.staging
            out += [
                objects.dataset_pvc(
                    profile, pipeline.dataset, st.pvc_size, st.storage_class, st.access_mode
                ),
                objects.models_pvc(profile),
            ]
            continue
        if s == "scorer":  # a pipeline that scores a stream: its scorer Deployment
            if pipeline.scoring.stream is not None or step == s:
                from trainyard.k8s.scoring import scorer_deployment

                out.append(scorer_deployment(profile, pipeline))
            continue
        if s == "approval" and pipeline.gate.approval != "required" and step != s:
            continue
        if s == "train":
            snap = fill(s, "{snapshot}")
            training = training_params(pipeline, None)
            tr = run_training_objects(profile, pipeline, training, snap, run_id, kueue=kueue)
            out += [tr.service, *tr.jobs]
            continue
        values = {k: fill(s, v) for k, v in SAMPLE_VALUES[s].items()}
        if s == "deploy":
            sv = pipeline.serving
            out += [
                objects.serving_deployment(profile, sv.model_name, values["version"], sv.replicas),
                objects.serving_service(profile, sv.model_name),
            ]
        out.append(step_pod(profile, pipeline, s, values, run_id=run_id))
    return out


def render_problems(profile: ClusterProfile, pipeline: PipelineConfig) -> list[str]:
    """What keeps the pipeline's objects from rendering for the cluster, as ``render`` says it.

    Renders every step (with a sample snapshot id and version) and checks each object
    against the schemas and Pod Security, as ``render --step all`` does: ``pipelines check``
    on a cluster passes only what renders.

    Returns:
        The problems, none if every object renders and is valid.
    """
    try:
        objs = render_objects(profile, pipeline, "all", snapshot="0" * 16, version=1)
    except ConfigError as e:
        return [str(e)]
    return [f"rendered object invalid: {e}" for o in objs for e in checks.validate_object(o)]


def pipelines_main(argv: list[str]) -> int:
    """``python -m trainyard pipelines check [--profile FILE] [FILE ...]`` (default: all).

    Pipelines are checked against the cluster profile ``render`` would use: ``--profile``,
    else ``TRAINYARD_CLUSTER_PROFILE``, else ``deploy/cluster_profile.yaml``. Checked for a
    cluster (``--profile`` given, or ``TRAINYARD_RUNNER=kubernetes``), every object of a
    pipeline is also rendered and validated: what passes renders. Otherwise what would not
    run on a cluster (a Redis stream without ``url``) is said on its ``ok`` line.

    Args:
        argv: Arguments after ``pipelines``.

    Returns:
        0 if every pipeline is valid, 1 if any is not (or the profile is not), 2 on usage
        errors.
    """
    import sys
    from pathlib import Path

    from trainyard.config import InvalidPipelineConfig, pipeline_files, pipeline_json_schema
    from trainyard.fsutil import check_files
    from trainyard.pipelines import check_pipeline
    from trainyard.settings import get_settings

    parser = argtypes.ArgumentParser(prog="python -m trainyard pipelines")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check pipeline configs (default: every pipeline)")
    check.add_argument("files", nargs="*", type=Path)
    check.add_argument(
        "--profile",
        type=Path,
        help="cluster profile YAML, as for render (default: TRAINYARD_CLUSTER_PROFILE, "
        "else deploy/cluster_profile.yaml)",
    )
    sub.add_parser("schema", help="print the pipeline config's JSON schema")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.command == "schema":
        sys.stdout.write(pipeline_json_schema() + "\n")
        return 0
    files = args.files or pipeline_files()
    if not args.files:
        for stray in sorted(get_settings().pipelines_dir.glob("*.yml")):
            sys.stderr.write(f"{stray}: ignored: pipeline files end in .yaml\n")
    if not files:
        sys.stderr.write(f"no pipelines found in {get_settings().pipelines_dir}\n")
        return 1
    from trainyard.k8s.scoring import cluster_stream_problem

    try:
        profile = load_cluster_profile(args.profile)
    except ConfigError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    cluster = args.profile is not None or get_settings().runner == "kubernetes"

    def check(path: Path) -> PipelineConfig:
        cfg = check_pipeline(path, profile, cluster=cluster)
        if cluster and (problems := render_problems(profile, cfg)):
            raise InvalidPipelineConfig(path, [f"{path}: render: {p}" for p in problems])
        return cfg

    def describe(cfg: PipelineConfig) -> str:
        said = f"pipeline {cfg.name}: dataset {cfg.dataset}, model {cfg.training.model}"
        if not cluster and (why := cluster_stream_problem(cfg)):
            said += f"; not for a cluster: scoring.stream: {why}"
        return said

    return check_files(files, check, describe, ConfigError, "pipeline")


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

    p = argtypes.ArgumentParser(prog="python -m trainyard render")
    p.add_argument("pipeline")
    p.add_argument("--step", choices=RENDER_STEPS, default="all")
    p.add_argument("--snapshot", help="snapshot id (validate, train, register)")
    p.add_argument(
        "--version", type=argtypes.version, help="model version, from 1 (evaluate, deploy)"
    )
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
    errors = [e for o in objs for e in checks.validate_object(o)]
    if errors:
        raise ConfigError("rendered objects are invalid:\n  " + "\n  ".join(errors))
    sys.stdout.write(checks.render_yaml(objs))
    return 0
