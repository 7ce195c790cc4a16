"""The stream scorer's Deployment on a cluster (``python -m trainyard score-stream``).

One pod per partition of the Kafka input topic (``scoring.stream.partitions``): a consumer
group never gives one partition to two members, so more pods would idle. Pods run on the
CPU pool from the steps image (which carries the pipeline configs and contracts), reach
the model through the serving Service and restart when their status file goes stale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.errors import ConfigError
from trainyard.k8s.objects import (
    APP_LABEL,
    COMPONENT_LABEL,
    MODEL_LABEL,
    PIPELINE_LABEL,
    STEP_PROGRAM,
    _env,
    _resources,
    _tmp_volume,
    model_key,
    pipeline_label,
    restricted_pod_security_context,
    restricted_security_context,
    scorer_name,
    serving_name,
)
from trainyard.k8s.placement import cpu_placement

if TYPE_CHECKING:
    from kubernetes.client import V1Deployment

    from trainyard.config import PipelineConfig
    from trainyard.k8s.profile import ClusterProfile

CONFIG_ANNOTATION = "trainyard.io/config-hash"
STATUS_FILE = "/tmp/scorer-status.json"
STALE_AFTER_S = 120
"""The liveness probe fails when the status file (rewritten every 5 s, also while the
scorer waits for a slow or dead model server) is older than this."""


def cluster_stream_problem(pipeline: PipelineConfig) -> str | None:
    """Why the pipeline's ``scoring.stream`` cannot run on a cluster, or None if it can.

    Redis without a ``url`` is the project's own server on this machine, which no pod
    reaches; it is fine on a laptop.
    """
    stream = pipeline.scoring.stream
    if stream is not None and stream.engine == "redis" and not stream.url:
        return (
            "engine redis without url is the project's own server on this machine; on a "
            "cluster give a url (redis://host:6379/0) or use engine kafka"
        )
    return None


def scorer_deployment(profile: ClusterProfile, pipeline: PipelineConfig) -> V1Deployment:
    """The scorer Deployment of a pipeline with ``scoring.stream``.

    Args:
        profile: Cluster profile (steps image, CPU pool, security, namespace).
        pipeline: The pipeline; its ``scoring.stream`` must be Kafka (or Redis with a
            ``url``: the project's own Redis server is a laptop's).

    Returns:
        A Deployment of ``partitions`` replicas; Pod Security "restricted", read-only root
        filesystem with ``/tmp`` an emptyDir, the config hash as a template annotation (a
        changed config rolls the pods), 60 s to commit what is in flight on SIGTERM.

    Raises:
        ConfigError: If the pipeline scores no stream, or its Redis stream has no ``url``.
    """
    from kubernetes.client import (
        V1Container,
        V1Deployment,
        V1DeploymentSpec,
        V1DeploymentStrategy,
        V1ExecAction,
        V1LabelSelector,
        V1ObjectMeta,
        V1PodSpec,
        V1PodTemplateSpec,
        V1Probe,
        V1RollingUpdateDeployment,
    )

    stream = pipeline.scoring.stream
    if stream is None:
        raise ConfigError(f"pipeline {pipeline.name!r} has no scoring.stream: no scorer to deploy")
    if why := cluster_stream_problem(pipeline):
        raise ConfigError(f"pipeline {pipeline.name!r}: scoring.stream: {why}")
    name = scorer_name(pipeline.name)
    selector = {
        APP_LABEL: "trainyard",
        COMPONENT_LABEL: "scorer",
        PIPELINE_LABEL: pipeline_label(pipeline.name),
    }
    labels = {**selector, MODEL_LABEL: model_key(pipeline.serving.model_name)}
    annotations = {CONFIG_ANNOTATION: pipeline.config_hash()}
    tmp_vol, tmp_mount = _tmp_volume()
    place = cpu_placement(profile)
    serving_host = f"{serving_name(pipeline.serving.model_name)}.{profile.namespace}.svc"
    stale = f'test $(( $(date +%s) - $(stat -c %Y "{STATUS_FILE}") )) -lt {STALE_AFTER_S}'
    container = V1Container(
        name="scorer",
        image=profile.images.steps,
        image_pull_policy=profile.images.pull_policy,
        command=[*STEP_PROGRAM, "score-stream"],
        args=["--pipeline", pipeline.name, "--status-file", STATUS_FILE],
        env=_env(
            {
                "TRAINYARD_SERVING_HOST": serving_host,
                "TRAINYARD_RUNNER": "local",
                "PYTHONUNBUFFERED": "1",
                "HOME": "/tmp",
            }
        ),
        resources=_resources(profile.resources.steps),
        security_context=restricted_security_context(read_only_root=True),
        volume_mounts=[tmp_mount],
        liveness_probe=V1Probe(
            _exec=V1ExecAction(command=["sh", "-c", stale]),
            initial_delay_seconds=30,
            period_seconds=30,
            failure_threshold=3,
        ),
    )
    return V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=V1ObjectMeta(
            name=name, namespace=profile.namespace, labels=labels, annotations=annotations
        ),
        spec=V1DeploymentSpec(
            replicas=stream.partitions,
            selector=V1LabelSelector(match_labels=selector),
            # never more members than partitions: a surplus member would idle
            strategy=V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=V1RollingUpdateDeployment(max_unavailable=1, max_surge=0),
            ),
            revision_history_limit=5,
            template=V1PodTemplateSpec(
                metadata=V1ObjectMeta(labels=labels, annotations=annotations),
                spec=V1PodSpec(
                    service_account_name=profile.service_account,
                    automount_service_account_token=False,
                    enable_service_links=False,
                    termination_grace_period_seconds=60,
                    security_context=restricted_pod_security_context(profile),
                    containers=[container],
                    volumes=[tmp_vol],
                    **place.pod_fields(),
                ),
            ),
        ),
    )
