"""TF_CONFIG: read, derived from the Indexed Job environment, and checked, for every role."""

from __future__ import annotations

import json

import pytest

from trainyard.errors import ConfigError
from trainyard.training.worker.tf_config import (
    cluster_roles,
    make_tf_config,
    resolve_tf_config,
    role_of,
)

JOBS = {
    "chief": {"job": "tr-chief", "replicas": 1},
    "worker": {"job": "tr-worker", "replicas": 2},
    "ps": {"job": "tr-ps", "replicas": 1},
}
CLUSTER = {
    "chief": ["tr-chief-0.tr-svc:2222"],
    "worker": ["tr-worker-0.tr-svc:2222", "tr-worker-1.tr-svc:2222"],
    "ps": ["tr-ps-0.tr-svc:2222"],
}


def _env(task_type: str, index: int, jobs: dict = JOBS, **extra: str) -> dict[str, str]:
    env = {
        "JOB_COMPLETION_INDEX": str(index),
        "TRAINYARD_TF_TASK_TYPE": task_type,
        "TRAINYARD_TF_JOBS": json.dumps(jobs),
        "TRAINYARD_TF_SERVICE": "tr-svc",
    }
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("task_type", "index", "is_chief"),
    [("chief", 0, True), ("worker", 0, False), ("worker", 1, False), ("ps", 0, False)],
    ids=["chief", "worker-0", "worker-1", "ps-0"],
)
def test_derive_parameter_server_roles(task_type: str, index: int, is_chief: bool) -> None:
    cfg = resolve_tf_config(_env(task_type, index))
    assert cfg == {"cluster": CLUSTER, "task": {"type": task_type, "index": index}}
    role = role_of(cfg)
    assert (role.task_type, role.index, role.is_chief, role.num_workers) == (
        task_type,
        index,
        is_chief,
        2,
    )


@pytest.mark.parametrize(
    ("index", "is_chief"), [(0, True), (1, False), (2, False)], ids=["w0", "w1", "w2"]
)
def test_derive_all_reduce_workers_worker0_is_chief(index: int, is_chief: bool) -> None:
    jobs = {"worker": {"job": "mw", "replicas": 3}}
    cfg = resolve_tf_config(_env("worker", index, jobs, TRAINYARD_TF_PORT="3333"))
    assert cfg["cluster"] == {"worker": [f"mw-{i}.tr-svc:3333" for i in range(3)]}
    assert role_of(cfg).is_chief is is_chief


def test_explicit_tf_config_wins_over_derivation() -> None:
    explicit = make_tf_config({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker", 1)
    cfg = resolve_tf_config({**_env("chief", 0), "TF_CONFIG": json.dumps(explicit)})
    assert cfg == explicit


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            "missing JOB_COMPLETION_INDEX, TRAINYARD_TF_TASK_TYPE, "
            "TRAINYARD_TF_JOBS, TRAINYARD_TF_SERVICE",
        ),
        (_env("worker", 2), "task.index 2 out of range for worker"),
        (_env("evaluator", 0), "task.type 'evaluator' is not in the cluster"),
        (
            _env("worker", 0, {"worker": {"job": "w", "replicas": 0}}),
            "replicas must be a positive integer",
        ),
        (_env("worker", 0, {"gpu": {"job": "w", "replicas": 1}}), "unknown task type 'gpu'"),
        (_env("ps", 0, {"ps": {"job": "p", "replicas": 1}}), "cluster has no 'worker' task"),
        ({**_env("worker", 0), "TRAINYARD_TF_JOBS": "{"}, "TRAINYARD_TF_JOBS is not valid JSON"),
        (
            {**_env("worker", 0), "JOB_COMPLETION_INDEX": "x"},
            "JOB_COMPLETION_INDEX must be an integer",
        ),
        (
            {**_env("worker", 0), "TRAINYARD_TF_PORT": "http"},
            "TRAINYARD_TF_PORT must be an integer",
        ),
        ({"TF_CONFIG": "not json"}, "TF_CONFIG is not valid JSON"),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}
                )
            },
            "duplicate addresses",
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"worker": ["a:1"], "chief": ["b:1", "c:1"]},
                        "task": {"type": "worker", "index": 0},
                    }
                )
            },
            "at most one chief",
        ),
    ],
    ids=[
        "nothing-set",
        "index-out-of-range",
        "unknown-task-type",
        "zero-replicas",
        "bad-type-in-jobs",
        "no-workers",
        "jobs-not-json",
        "index-not-int",
        "port-not-int",
        "tf-config-not-json",
        "duplicate-address",
        "two-chiefs",
    ],
)
def test_bad_environment_is_one_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_tf_config(env)


@pytest.mark.parametrize(
    ("strategy", "workers", "ps", "expected"),
    [
        ("multi_worker_mirrored", 2, 1, [("worker", 0), ("worker", 1)]),
        ("parameter_server", 2, 1, [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]),
    ],
    ids=["mwms", "ps"],
)
def test_cluster_roles(strategy: str, workers: int, ps: int, expected: list) -> None:
    assert cluster_roles(strategy, workers, ps) == expected


def test_parameter_server_needs_a_ps() -> None:
    with pytest.raises(ConfigError, match="parameter_servers must be >= 1"):
        cluster_roles("parameter_server", 2, 0)
