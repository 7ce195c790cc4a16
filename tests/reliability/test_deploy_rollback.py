"""Deploy against a real detached server process: success, and rollback on every failure."""

from __future__ import annotations

import numpy as np
import pytest
from serving_support import (
    IMAGE_SPEC,
    build_image_model,
    expected_classes,
    free_port,
)

from trainyard.errors import DeployError
from trainyard.serving.client import ServingClient
from trainyard.serving.deploy import (
    LOG_FILE,
    PID_FILE,
    deploy,
    ensure_local_server,
    stop_local_server,
)

ROWS = np.random.default_rng(3).random((8, 8, 8, 1), dtype=np.float32)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("deploy")
    models = root / "models"
    build_image_model(models / "good0", seed=0)
    build_image_model(models / "good1", seed=1)
    build_image_model(models / "pixels", input_name="pixels")
    build_image_model(models / "big", side=28)
    corrupt = build_image_model(models / "corrupt", seed=2)
    (corrupt / "saved_model.pb").write_bytes(b"not a protobuf" * 20)
    serving_root = root / "serving"
    port = free_port()
    pid = ensure_local_server(serving_root, "127.0.0.1", port)
    yield {"models": models, "root": serving_root, "port": port, "pid": pid}
    stop_local_server(serving_root)


def _deploy(env, version, model, expected, previous, **kw):
    return deploy(
        "digits",
        version,
        env["models"] / model,
        env["root"],
        "127.0.0.1",
        env["port"],
        {"image": ROWS},
        expected,
        IMAGE_SPEC,
        previous,
        timeout_s=60,
        **kw,
    )


def _served_classes(env) -> list[int]:
    with ServingClient("127.0.0.1", env["port"]) as c:
        return c.predict("digits", inputs={"image": ROWS.tolist()})["class_id"]


def test_server_runs_detached_with_pid_and_log_files(env):
    assert env["pid"] > 0
    assert (env["root"] / PID_FILE).is_file()
    assert (env["root"] / LOG_FILE).is_file()
    assert ensure_local_server(env["root"], "127.0.0.1", env["port"]) == env["pid"]


def test_first_deploy_succeeds(env):
    want = expected_classes(ROWS, seed=0)
    result = _deploy(env, 1, "good0", want, None)
    assert not result.rolled_back
    assert result.status["state"] == "AVAILABLE"
    assert result.smoke_rows == 8
    assert result.sample_prediction["class_id"] == want[0]
    assert result.url.endswith("/v1/models/digits/versions/1:predict")
    assert _served_classes(env) == want.tolist()


FAILURES = [
    ("corrupt SavedModel", 2, "corrupt", 0, "failed to load"),
    ("input renamed", 3, "pixels", 0, "differ from the contract's features"),
    ("input shape incompatible", 4, "big", 0, "has shape [None, 28, 28, 1] in the signature"),
    ("predictions differ from offline evaluation", 5, "good1", 0, "smoke test:"),
]


@pytest.mark.parametrize(
    ("version", "model", "seed", "message"),
    [c[1:] for c in FAILURES],
    ids=[c[0] for c in FAILURES],
)
def test_failed_deploy_rolls_back_and_old_version_keeps_serving(env, version, model, seed, message):
    with pytest.raises(DeployError) as exc:
        _deploy(env, version, model, expected_classes(ROWS, seed=seed), 1)
    text = str(exc.value)
    assert f"version {version} rolled back" in text
    assert message in text
    assert "previous version 1 is AVAILABLE again" in text
    assert not (env["root"] / "digits" / str(version)).exists()
    assert [p.name for p in (env["root"] / "digits").iterdir()] == ["1"]
    with ServingClient("127.0.0.1", env["port"]) as c:
        assert [(e["version"], e["state"]) for e in c.status("digits")] == [("1", "AVAILABLE")]
    assert _served_classes(env) == expected_classes(ROWS, seed=0).tolist()


def test_rollback_can_be_returned_instead_of_raised(env):
    result = _deploy(env, 6, "good1", expected_classes(ROWS, seed=0), 1, raise_on_rollback=False)
    assert result.rolled_back
    assert "smoke test" in result.reason


def test_next_good_deploy_replaces_champion_and_redeploy_is_idempotent(env):
    want = expected_classes(ROWS, seed=1)
    assert not _deploy(env, 7, "good1", want, 1).rolled_back
    assert _served_classes(env) == want.tolist()
    assert not _deploy(env, 7, "good1", want, 1).rolled_back
    with pytest.raises(DeployError, match="already published with different content"):
        _deploy(env, 7, "good0", expected_classes(ROWS, seed=0), 1)
    assert _served_classes(env) == want.tolist()


def test_stop_local_server_shuts_down_gracefully(env):
    assert stop_local_server(env["root"])
    assert not (env["root"] / PID_FILE).exists()
    with pytest.raises(OSError):
        ServingClient("127.0.0.1", env["port"], timeout=2).request("GET", "/v1/models/digits")
    assert not stop_local_server(env["root"])
    log = (env["root"] / LOG_FILE).read_text()
    assert "model digits version 1 AVAILABLE" in log
    assert "shutting down (finishing in-flight requests)" in log
    assert log.rstrip().endswith("stopped"), log[-500:]
