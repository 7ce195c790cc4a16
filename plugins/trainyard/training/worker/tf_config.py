"""``TF_CONFIG``: read it, or derive it from the Kubernetes Indexed Job environment.

No TensorFlow import: the launcher and the Kubernetes renderer use these functions too.

The environment contract of a training pod is written once, in
:mod:`trainyard.training.spec`: ``JOB_COMPLETION_INDEX`` (set by Kubernetes), the role,
the attempt's Jobs, the headless Service and the port; the local runner adds a map of the
Service's DNS names to loopback addresses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainyard.errors import ConfigError
from trainyard.training.spec import (
    ENV_HOSTS,
    ENV_INDEX,
    ENV_JOBS,
    ENV_PORT,
    ENV_SERVICE,
    ENV_TASK_TYPE,
)

TASK_TYPES = ("chief", "worker", "ps")
DEFAULT_PORT = 2222


@dataclass(frozen=True)
class Role:
    """This process's place in the cluster.

    Attributes:
        task_type: ``chief``, ``worker`` or ``ps``.
        index: Task index within its type.
        num_workers: Number of ``worker`` tasks.
        has_chief: Whether the cluster has a separate ``chief`` task.
    """

    task_type: str
    index: int
    num_workers: int
    has_chief: bool

    @property
    def is_chief(self) -> bool:
        """The task that writes the final artifacts (``chief``, else ``worker`` 0)."""
        if self.has_chief:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.index == 0

    @property
    def name(self) -> str:
        """``<type>:<index>``, used as log prefix."""
        return f"{self.task_type}:{self.index}"


def make_tf_config(cluster: Mapping[str, list[str]], task_type: str, index: int) -> dict[str, Any]:
    """Build and check one task's ``TF_CONFIG``.

    Args:
        cluster: Task type → list of ``host:port`` addresses.
        task_type: This task's type.
        index: This task's index.

    Returns:
        ``{"cluster": ..., "task": {"type": ..., "index": ...}}``.

    Raises:
        ConfigError: If the cluster or the task is inconsistent.
    """
    cfg = {
        "cluster": {t: list(a) for t, a in cluster.items()},
        "task": {"type": task_type, "index": index},
    }
    return validate_tf_config(cfg)


def validate_tf_config(cfg: Any, source: str = "TF_CONFIG") -> dict[str, Any]:
    """Check a parsed ``TF_CONFIG``.

    Args:
        cfg: The parsed JSON.
        source: Where it came from (named in errors).

    Returns:
        The same mapping.

    Raises:
        ConfigError: Unknown task types, empty or duplicate addresses, an index out of
            range, or a cluster without workers.
    """
    if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster"), dict):
        raise ConfigError(f"{source}: expected an object with 'cluster' and 'task'")
    cluster = cfg["cluster"]
    task = cfg.get("task")
    if not isinstance(task, dict):
        raise ConfigError(f"{source}: 'task' must be an object with 'type' and 'index'")
    for ttype, addrs in cluster.items():
        if ttype not in TASK_TYPES:
            raise ConfigError(f"{source}: unknown task type {ttype!r} (expected {TASK_TYPES})")
        if (
            not isinstance(addrs, list)
            or not addrs
            or not all(isinstance(a, str) and ":" in a for a in addrs)
        ):
            raise ConfigError(f"{source}: cluster.{ttype} must be a non-empty list of host:port")
    if len(cluster.get("chief", [])) > 1:
        raise ConfigError(f"{source}: at most one chief, got {len(cluster['chief'])}")
    if not cluster.get("worker"):
        raise ConfigError(f"{source}: cluster has no 'worker' task")
    everyone = [a for addrs in cluster.values() for a in addrs]
    if len(set(everyone)) != len(everyone):
        raise ConfigError(f"{source}: duplicate addresses in cluster {everyone}")
    ttype, index = task.get("type"), task.get("index")
    if ttype not in cluster:
        raise ConfigError(f"{source}: task.type {ttype!r} is not in the cluster {sorted(cluster)}")
    if (
        not isinstance(index, int)
        or isinstance(index, bool)
        or not 0 <= index < len(cluster[ttype])
    ):
        raise ConfigError(
            f"{source}: task.index {index!r} out of range for {ttype} "
            f"(0..{len(cluster[ttype]) - 1})"
        )
    return cfg


def derive_tf_config(env: Mapping[str, str]) -> dict[str, Any]:
    """Derive ``TF_CONFIG`` from the Indexed Job environment.

    Args:
        env: The process environment (``os.environ``).

    Returns:
        The ``TF_CONFIG`` of this pod; task ``i`` of type ``t`` is at
        ``<jobs[t].job>-<i>.<service>:<port>``.

    Raises:
        ConfigError: A variable is missing or malformed (names the variable).
    """
    missing = [k for k in (ENV_INDEX, ENV_TASK_TYPE, ENV_JOBS, ENV_SERVICE) if not env.get(k)]
    if missing:
        raise ConfigError(f"TF_CONFIG is unset and cannot be derived: missing {', '.join(missing)}")
    try:
        index = int(env[ENV_INDEX])
    except ValueError as e:
        raise ConfigError(
            f"JOB_COMPLETION_INDEX must be an integer, got {env['JOB_COMPLETION_INDEX']!r}"
        ) from e
    try:
        port = int(env.get(ENV_PORT) or DEFAULT_PORT)
    except ValueError as e:
        raise ConfigError(
            f"TRAINYARD_TF_PORT must be an integer, got {env['TRAINYARD_TF_PORT']!r}"
        ) from e
    try:
        jobs = json.loads(env[ENV_JOBS])
    except json.JSONDecodeError as e:
        raise ConfigError(f"TRAINYARD_TF_JOBS is not valid JSON: {e}") from e
    if not isinstance(jobs, dict) or not jobs:
        raise ConfigError("TRAINYARD_TF_JOBS must be a non-empty JSON object")
    service = env[ENV_SERVICE]
    cluster: dict[str, list[str]] = {}
    for ttype, job in jobs.items():
        if not isinstance(job, dict) or not isinstance(job.get("job"), str) or not job["job"]:
            raise ConfigError(
                f"TRAINYARD_TF_JOBS.{ttype}: expected {{'job': <name>, 'replicas': <n>}}"
            )
        replicas = job.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ConfigError(
                f"TRAINYARD_TF_JOBS.{ttype}.replicas must be a positive integer, got {replicas!r}"
            )
        cluster[ttype] = [f"{job['job']}-{i}.{service}:{port}" for i in range(replicas)]
    hosts = _host_map(env)
    if hosts:
        cluster = {
            t: [hosts.get(a.rsplit(":", 1)[0], a) for a in addrs] for t, addrs in cluster.items()
        }
    return validate_tf_config(
        {"cluster": cluster, "task": {"type": env[ENV_TASK_TYPE], "index": index}},
        source="derived TF_CONFIG",
    )


def _host_map(env: Mapping[str, str]) -> dict[str, str]:
    """The local runner's map of pod DNS names to loopback ``host:port`` (else empty)."""
    raw = env.get(ENV_HOSTS)
    if not raw:
        return {}
    try:
        hosts = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{ENV_HOSTS} is not valid JSON: {e}") from e
    if not isinstance(hosts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and ":" in v for k, v in hosts.items()
    ):
        raise ConfigError(f"{ENV_HOSTS} must map DNS names to host:port strings")
    return hosts


def resolve_tf_config(env: Mapping[str, str]) -> dict[str, Any]:
    """``TF_CONFIG`` from the environment if set, else derived from the Indexed Job variables.

    Args:
        env: The process environment.

    Returns:
        The checked ``TF_CONFIG``.

    Raises:
        ConfigError: If it is malformed or cannot be derived.
    """
    raw = env.get("TF_CONFIG")
    if raw:
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ConfigError(f"TF_CONFIG is not valid JSON: {e}") from e
        return validate_tf_config(cfg)
    return derive_tf_config(env)


def role_of(cfg: Mapping[str, Any]) -> Role:
    """This task's role in a checked ``TF_CONFIG``."""
    cluster = cfg["cluster"]
    return Role(
        task_type=cfg["task"]["type"],
        index=int(cfg["task"]["index"]),
        num_workers=len(cluster["worker"]),
        has_chief="chief" in cluster,
    )


def cluster_roles(strategy: str, workers: int, parameter_servers: int) -> list[tuple[str, int]]:
    """The (task type, index) of every task a training run starts.

    Args:
        strategy: ``multi_worker_mirrored`` or ``parameter_server``.
        workers: Number of workers.
        parameter_servers: Number of parameter servers (``parameter_server`` only).

    Returns:
        N ``worker`` tasks for all-reduce; else ``chief`` + N ``worker`` + P ``ps``.

    Raises:
        ConfigError: Unknown strategy, or ``parameter_server`` without a parameter server.
    """
    if workers < 1:
        raise ConfigError(f"training.workers must be >= 1, got {workers}")
    if strategy == "multi_worker_mirrored":
        return [("worker", i) for i in range(workers)]
    if strategy == "parameter_server":
        if parameter_servers < 1:
            raise ConfigError(
                "training.parameter_servers must be >= 1 for strategy parameter_server"
            )
        return (
            [("chief", 0)]
            + [("worker", i) for i in range(workers)]
            + [("ps", i) for i in range(parameter_servers)]
        )
    raise ConfigError(f"unknown training.strategy {strategy!r}")
