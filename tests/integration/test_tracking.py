"""``trainyard.tracking``: the tracker's address, and the mirror against a real MLflow server.

The server is a real ``mlflow server`` (``tests/support/mlflow_server.py``); the versions here are
registered from tiny files (no training: ``tests/e2e/test_mlflow_tracking.py`` mirrors
trained ones through the steps).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from tests.support.mlflow_server import (
    aliases,
    artifact,
    history,
    mlflow_server,
    model_versions,
    run_of_version,
    runs_of,
    tags,
)
from trainyard.config import TrackingConfig, load_pipeline
from trainyard.layout import Layout
from trainyard.registry import Registry
from trainyard.tracking import Endpoint, TrackingError, mirror, tracking_uri

CASES = [
    ("plain URI", {"AIRFLOW_CONN_MLFLOW_X": "http://mlflow.internal:5000"},
     Endpoint("http://mlflow.internal:5000")),
    ("URI with a path prefix and a trailing slash",
     {"AIRFLOW_CONN_MLFLOW_X": "https://host/mlflow/"}, Endpoint("https://host/mlflow")),
    ("URI with basic auth", {"AIRFLOW_CONN_MLFLOW_X": "http://ann:s%40cret@h:80"},
     Endpoint("http://h:80", "Basic YW5uOnNAY3JldA==")),
    ("JSON form", {"AIRFLOW_CONN_MLFLOW_X": json.dumps(
        {"conn_type": "http", "host": "h", "port": 5000, "schema": "api"})},
     Endpoint("http://h:5000/api")),
    ("JSON form, scheme in the host (the HTTP connection's habit)",
     {"AIRFLOW_CONN_MLFLOW_X": json.dumps({"conn_type": "http", "host": "https://h"})},
     Endpoint("https://h")),
    ("MLFLOW_TRACKING_URI when the connection is not in the environment",
     {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}, Endpoint("http://127.0.0.1:5000")),
    ("the connection wins over MLFLOW_TRACKING_URI",
     {"AIRFLOW_CONN_MLFLOW_X": "http://a:1", "MLFLOW_TRACKING_URI": "http://b:2"},
     Endpoint("http://a:1")),
]  # fmt: skip


@pytest.mark.parametrize(("env", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_tracker_address_comes_from_the_connection(env, expected) -> None:
    assert tracking_uri("mlflow_x", env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no AIRFLOW_CONN_MLFLOW_X and no MLFLOW_TRACKING_URI"),
        ({"AIRFLOW_CONN_MLFLOW_X": "postgres://h/db"}, "over http or https"),
        ({"AIRFLOW_CONN_MLFLOW_X": "{not json"}, "neither a URI nor JSON"),
        ({"AIRFLOW_CONN_MLFLOW_X": "http://u:pw@:5000"}, "'http://***@"),
    ],
    ids=["missing", "not http", "bad JSON", "no host (password not shown)"],
)
def test_an_unusable_connection_says_why(env, message) -> None:
    with pytest.raises(TrackingError) as exc:
        tracking_uri("mlflow_x", env)
    assert message in str(exc.value)
    assert "pw" not in str(exc.value)


def _pipeline(conn_id: str = "mlflow_test", name: str | None = None):
    """The digits pipeline with tracking; ``name`` gives its own experiment and model."""
    cfg = load_pipeline("digits")
    tracking = TrackingConfig(
        backend="mlflow",
        conn_id=conn_id,
        timeout_s=5,
        experiment=f"trainyard/{name}" if name else None,
        registered_model=name,
    )
    return cfg.model_copy(update={"tracking": tracking})


def _version(reg: Registry, tmp: Path, gate: str | None = None) -> int:
    """A version registered from tiny files, with a 3-epoch history (and a gate verdict)."""
    out = tmp / f"out-{len(reg.list_versions())}"
    (out / "model" / "variables").mkdir(parents=True)
    (out / "model" / "saved_model.pb").write_bytes(b"\x08\x01")
    (out / "model" / "variables" / "variables.index").write_bytes(b"index")
    epochs = [
        {"epoch": e, "attempt": 0, "loss": 1.0 / (e + 1), "accuracy": 0.3 * e} for e in range(3)
    ]
    (out / "history.json").write_text(json.dumps({"epochs": epochs, "attempts": []}))
    meta = {
        "dataset": "digits",
        "snapshot_id": "s1",
        "snapshots": [{"dataset": "digits", "snapshot_id": "s1"}],
        "contract_version": "1.0.0",
        "training": {"epochs": 3, "learning_rate": 0.003, "window": "newest"},
        "train_metrics": {"loss": 0.33, "accuracy": 0.6},
        "run_id": "manual__x",
    }
    version = reg.register(out / "model", meta, extra_files=[out / "history.json"])
    if gate:
        reg.attach(
            version,
            "gate.json",
            json.dumps({"verdict": gate, "candidate_metrics": {"accuracy": 0.9}}),
        )
        reg.attach(version, "gate.md", f"# {gate}\n")
    return version


@pytest.fixture
def registry(volume_root: Path) -> Registry:
    return Registry(Layout(volume_root).models_root, "digits")


def test_a_tracker_that_is_down_is_one_warning_naming_it(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", f"http://127.0.0.1:{port}")
    version = _version(registry, tmp_path, gate="promote")
    with caplog.at_level(logging.WARNING, logger="trainyard.tracking"):
        assert mirror(_pipeline(), registry, version) is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert f"http://127.0.0.1:{port}" in warnings[0].getMessage()
    assert "the run goes on" in warnings[0].getMessage()
    assert registry.list_versions() == [version]  # trainyard's side untouched


def test_an_undefined_connection_is_one_warning(registry: Registry, tmp_path: Path, caplog) -> None:
    version = _version(registry, tmp_path)
    with caplog.at_level(logging.WARNING, logger="trainyard.tracking"):
        assert mirror(_pipeline("nowhere_defined"), registry, version) is None
    assert "AIRFLOW_CONN_NOWHERE_DEFINED" in caplog.text


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_the_mirror_follows_the_registry_and_never_duplicates(
    server: str, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", server)
    cfg = _pipeline()
    v1 = _version(registry, tmp_path)
    assert mirror(cfg, registry, v1) is not None  # registered, not gated yet
    (run,) = run_of_version(server, "trainyard/digits", v1)
    assert tags(run)["trainyard.pipeline"] == "digits"
    assert "trainyard.verdict" not in tags(run)
    registry.attach(
        v1, "gate.json", json.dumps({"verdict": "promote", "candidate_metrics": {"accuracy": 0.9}})
    )
    registry.attach(v1, "gate.md", "# promote\n")
    mirror(cfg, registry, v1)  # gated
    mirror(cfg, registry, v1)  # and again: nothing new
    (run,) = run_of_version(server, "trainyard/digits", v1)
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["training.epochs"] == "3"
    assert params["snapshot_id"] == "s1"
    assert params["contract_version"] == "1.0.0"
    assert history(server, run["info"]["run_id"], "loss") == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert history(server, run["info"]["run_id"], "eval_accuracy") == [(0, 0.9)]
    assert tags(run)["trainyard.verdict"] == "promote"
    assert json.loads(artifact(server, run, "gate.json"))["verdict"] == "promote"
    assert artifact(server, run, "model/saved_model.pb") == b"\x08\x01"
    assert len(model_versions(server, "digits")) == 1
    assert aliases(server, "digits") == {"challenger": v1}

    registry.promote(v1, reason="test", actor="tests")
    v2 = _version(registry, tmp_path, gate="promote")
    v3 = _version(registry, tmp_path, gate="reject")
    mirror(cfg, registry, v3)  # v2 was never mirrored: the alias brings it along
    assert aliases(server, "digits") == {"champion": v1, "challenger": v2}
    registry.promote(v2, reason="test", actor="tests")
    mirror(cfg, registry)
    assert aliases(server, "digits") == {"champion": v2}
    registry.rollback(reason="test", actor="tests")
    mirror(cfg, registry)
    # rolled back from: not a challenger (finding 19)
    assert aliases(server, "digits") == {"champion": v1}
    assert sorted(
        int(tags(r)["trainyard.version"]) for r in runs_of(server, "trainyard/digits")
    ) == [1, 2, 3]
    assert len(model_versions(server, "digits")) == 3


def test_the_local_runner_hands_a_step_airflows_lookup_of_the_connection(
    monkeypatch: pytest.MonkeyPatch, caplog, capfd
) -> None:
    from trainyard.orchestration.runners import connection_env

    # Airflow finds it (here in its environment backend; its database works the same way)
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_Y", "http://ann:secret1@h:5000/pre")
    cfg = _pipeline("mlflow_y")
    env = connection_env(cfg, "register", environ={})
    assert tracking_uri("mlflow_y", env) == Endpoint("http://h:5000/pre", "Basic YW5uOnNlY3JldDE=")
    assert connection_env(cfg, "register") == {}  # the process has it already: left alone
    assert connection_env(cfg, "stage", environ={}) == {}  # stage mirrors nothing
    with caplog.at_level(logging.WARNING):
        assert connection_env(_pipeline("nope"), "evaluate", environ={}) == {}
    # (Airflow's logging may route the orchestration logger past caplog)
    assert "connection 'nope'" in caplog.text + "".join(capfd.readouterr())


def _mirrored(server: str, experiment: str) -> dict[int, dict]:
    """The one run of each trainyard version in an experiment."""
    out: dict[int, dict] = {}
    for run in runs_of(server, experiment):
        version = int(tags(run)["trainyard.version"])
        assert version not in out, f"two runs of version {version}"
        out[version] = run
    return out


_STUCK_AT_THE_VARIABLES = """
import sys, time
from trainyard import tracking
from trainyard.config import TrackingConfig, load_pipeline
from trainyard.registry import Registry

put = tracking.MlflowRest.put_artifact

def stuck(self, artifact_uri, name, data):
    if name.startswith("model/variables/"):
        print("stuck", flush=True)
        time.sleep(600)
    put(self, artifact_uri, name, data)

tracking.MlflowRest.put_artifact = stuck
tracking_cfg = TrackingConfig(
    backend="mlflow",
    conn_id="mlflow_test",
    timeout_s=5,
    experiment="trainyard/repair",
    registered_model="repair",
)
cfg = load_pipeline("digits").model_copy(update={"tracking": tracking_cfg})
tracking.mirror(cfg, Registry(sys.argv[1], "digits"), int(sys.argv[2]))
"""
"""A mirror of ``argv[2]`` into experiment ``trainyard/repair`` that stops (to be killed)
just before uploading the SavedModel's variables."""


def test_a_mirror_that_failed_or_was_killed_halfway_is_completed_by_the_next(
    server: str, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Findings 14 and 15: a partial run is repaired, whatever version the next mirror is for."""
    import socket
    import subprocess
    import urllib.error

    cfg, exp = _pipeline(name="repair"), "trainyard/repair"
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", server)
    v1 = _version(registry, tmp_path)
    assert mirror(cfg, registry, v1) is not None  # register: mirrored
    registry.attach(
        v1, "gate.json", json.dumps({"verdict": "promote", "candidate_metrics": {"accuracy": 0.9}})
    )
    registry.attach(v1, "gate.md", "# promote\n")
    with socket.socket() as s:  # evaluate: the tracker is down
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", f"http://127.0.0.1:{s.getsockname()[1]}")
    assert mirror(cfg, registry, v1) is None
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", server)
    (one,) = run_of_version(server, exp, v1)
    assert "trainyard.verdict" not in tags(one)  # partial: gated in trainyard, not in MLflow

    # v2's mirror is killed (kill -9) between the SavedModel's graph and its variables
    v2 = _version(registry, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_AT_THE_VARIABLES, str(registry.root.parent), str(v2)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "stuck"
    finally:
        proc.kill()
        proc.wait()
    runs = _mirrored(server, exp)
    assert runs[v2]["info"]["status"] == "RUNNING"
    assert artifact(server, runs[v2], "model/saved_model.pb") == b"\x08\x01"
    with pytest.raises(urllib.error.HTTPError):
        artifact(server, runs[v2], "model/variables/variables.index")

    # (that mirror completed v1 first); the next one, for another version, completes v2 (and
    # is not blocked by the dead mirror's lock: the kernel dropped it with the process)
    v3 = _version(registry, tmp_path)
    assert mirror(cfg, registry, v3) is not None
    runs = _mirrored(server, exp)
    assert sorted(runs) == [v1, v2, v3]
    one = runs[v1]
    assert history(server, one["info"]["run_id"], "eval_accuracy") == [(0, 0.9)]
    assert json.loads(artifact(server, one, "gate.json"))["verdict"] == "promote"
    assert artifact(server, one, "gate.md") == b"# promote\n"
    assert tags(one)["trainyard.verdict"] == "promote"
    assert tags(one)["trainyard.mirrored"] == "training;gate=promote"
    two = runs[v2]
    assert two["info"]["status"] == "FINISHED"
    assert artifact(server, two, "model/variables/variables.index") == b"index"
    assert tags(two)["trainyard.mirrored"] == "training"
    assert history(server, two["info"]["run_id"], "loss") == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert all(r["info"]["status"] == "FINISHED" for r in runs.values())
    assert len(model_versions(server, "repair")) == 3
    assert aliases(server, "repair") == {"challenger": v1}


def test_concurrent_mirrors_back_fill_once_in_trainyards_order(
    server: str, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Findings 16 and 18: one run and model version each; the older champion registered first."""
    import threading

    cfg, exp = _pipeline(name="concurrent"), "trainyard/concurrent"
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", server)
    v1 = _version(registry, tmp_path, gate="promote")
    registry.promote(v1, reason="test", actor="tests")  # a champion MLflow has never seen
    v2 = _version(registry, tmp_path, gate="promote")
    said: list[str | None] = []
    threads = [
        threading.Thread(target=lambda: said.append(mirror(cfg, registry, v2))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(said) == 4 and all(said), said
    assert sorted(_mirrored(server, exp)) == [v1, v2]
    numbers = {}
    for mv in model_versions(server, "concurrent"):
        tv = {t["key"]: t["value"] for t in mv.get("tags") or []}["trainyard.version"]
        assert tv not in numbers, f"two model versions of trainyard version {tv}"
        numbers[tv] = mv["version"]
    assert numbers == {str(v1): "1", str(v2): "2"}  # the back-filled champion first
    assert aliases(server, "concurrent") == {"champion": v1, "challenger": v2}


def test_a_deleted_experiment_is_one_warning_saying_how_to_fix_it(
    server: str, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """Finding 20."""
    from tests.support.mlflow_server import api

    cfg = _pipeline(name="deleted")
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", server)
    v1 = _version(registry, tmp_path)
    assert mirror(cfg, registry, v1) is not None
    exp = api(
        server, "GET", "mlflow/experiments/get-by-name", {"experiment_name": "trainyard/deleted"}
    )
    exp_id = exp["experiment"]["experiment_id"]
    api(server, "POST", "mlflow/experiments/delete", {"experiment_id": exp_id})
    v2 = _version(registry, tmp_path)
    with caplog.at_level(logging.WARNING, logger="trainyard.tracking"):
        assert mirror(cfg, registry, v2) is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"'trainyard/deleted' (id {exp_id}) is deleted" in warning
    assert "restore it in MLflow" in warning and "tracking.experiment" in warning
    assert "active' state" not in warning


def test_a_server_without_the_artifact_proxy_is_refused_before_any_run(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """Finding 21: the reason, and no run left RUNNING."""
    with mlflow_server(tmp_path / "mlflow", serve_artifacts=False) as url:
        monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", url)
        v1 = _version(registry, tmp_path, gate="promote")
        with caplog.at_level(logging.WARNING, logger="trainyard.tracking"):
            assert mirror(_pipeline(), registry, v1) is None
            assert mirror(_pipeline(), registry, v1) is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 2, warnings
        assert "--no-serve-artifacts" in warnings[0], warnings[0]
        assert runs_of(url, "trainyard/digits") == []
