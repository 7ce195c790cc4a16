"""Deploy against a real detached server process: success, and rollback on every failure."""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest

from tests.support.ports import free_port
from tests.support.serving import (
    IMAGE_SPEC,
    build_image_model,
    expected_classes,
)
from trainyard.errors import DeployError
from trainyard.serving import model_config
from trainyard.serving.client import ServingClient, ServingHTTPError
from trainyard.serving.deploy import (
    deploy,
    ensure_local_server,
    publish_version,
    serve_champion,
    server_pid_file,
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
        {"class_id": list(expected)},
        IMAGE_SPEC,
        previous,
        timeout_s=60,
        **kw,
    )


def _served_classes(env) -> list[int]:
    with ServingClient("127.0.0.1", env["port"]) as c:
        return c.predict("digits", inputs={"image": ROWS.tolist()})["class_id"]


def _version_dirs(env) -> list[str]:
    return sorted(p.name for p in (env["root"] / "digits").iterdir() if p.name.isdigit())


def _wait_served(
    env, want: list[int], versions: list[str], timeout: float = 30.0, reported=None
) -> None:
    """Wait until unversioned requests answer ``want`` and exactly ``versions`` are loaded."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with ServingClient("127.0.0.1", env["port"]) as c:
                status = c.status("digits")
            got = _served_classes(env)
        except ServingHTTPError:  # nothing served yet
            status, got = [], []
        loaded = [e["version"] for e in status if e["state"] == "AVAILABLE"]
        listed = [e["version"] for e in status]
        if (
            got == want
            and sorted(loaded) == sorted(versions)
            and (reported is None or listed == reported)
        ):
            return
        assert time.monotonic() < deadline, f"serving {loaded} answering {got}, want {versions}"
        time.sleep(0.2)


def test_server_runs_detached_with_pid_and_log_files(env):
    assert env["pid"] > 0
    assert server_pid_file(env["root"], env["port"]).is_file()
    assert (env["root"] / f".server-{env['port']}.log").is_file()
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
    assert _version_dirs(env) == ["1"]
    # within a poll the server forgets the removed version (a failed one is END until then)
    _wait_served(env, expected_classes(ROWS, seed=0).tolist(), ["1"], reported=["1"])


def test_rollback_can_be_returned_instead_of_raised(env):
    result = _deploy(env, 6, "good1", expected_classes(ROWS, seed=0), 1, raise_on_rollback=False)
    assert result.rolled_back
    assert "smoke test" in result.reason


def test_next_good_deploy_replaces_champion_and_redeploy_is_idempotent(env):
    want = expected_classes(ROWS, seed=1)
    assert not _deploy(env, 7, "good1", want, 1).rolled_back
    assert _served_classes(env) == want.tolist()
    # the champion is 7 now: deploying it again changes nothing
    assert not _deploy(env, 7, "good1", want, 7).rolled_back
    with pytest.raises(DeployError, match="already published with different content"):
        _deploy(env, 7, "good0", expected_classes(ROWS, seed=0), 7)
    _wait_served(env, want.tolist(), ["7"])


def test_champion_is_labelled_stable_in_the_model_config_and_on_the_server(env):
    served = model_config.served(env["root"], "digits")
    assert served is not None and served.versions == (7,)
    assert served.labels == {"stable": 7}
    every = model_config.read(env["root"] / model_config.ALL_MODELS_FILE)
    assert every == [served]
    with ServingClient("127.0.0.1", env["port"]) as c:
        status, body = c.request("GET", "/v1/models/digits/labels/stable/metadata")
        assert status == 200 and b'"version":"7"' in body.replace(b" ", b"")
        status, body = c.request("GET", "/v1/models/digits/labels/canary/metadata")
        assert status == 400 and b"Unrecognized servable version label: canary" in body


def test_a_rollback_of_the_champion_reaches_the_server_within_its_poll(env):
    # the registry's champion moves back from 7 to 1 (models rollback): serving follows
    t0 = time.monotonic()
    line = serve_champion(env["root"], "digits", 1, env["models"] / "good0", IMAGE_SPEC)
    assert line == "digits: serving version 1 (stable)"
    _wait_served(env, expected_classes(ROWS, seed=0).tolist(), ["1"])
    assert time.monotonic() - t0 < 10
    assert model_config.served(env["root"], "digits").labels == {"stable": 1}
    # and forward again (models promote 7)
    serve_champion(env["root"], "digits", 7, env["models"] / "good1", IMAGE_SPEC)
    _wait_served(env, expected_classes(ROWS, seed=1).tolist(), ["7"])


def test_a_deploy_killed_before_promotion_converges_on_the_champion(env):
    # what a SIGKILL between "serve the candidate" and "move the champion pointer" leaves:
    # version 9 published and served as canary (answering unversioned requests as latest)
    publish_version(env["models"] / "good0", env["root"], "digits", 9, IMAGE_SPEC)
    model_config.set_served(env["root"], "digits", [7, 9], {"stable": 7, "canary": 9})
    _wait_served(env, expected_classes(ROWS, seed=0).tolist(), ["7", "9"])
    # the next deploy (or promote/rollback) starts by serving the registry's champion
    serve_champion(env["root"], "digits", 7, env["models"] / "good1", IMAGE_SPEC)
    _wait_served(env, expected_classes(ROWS, seed=1).tolist(), ["7"])


def test_a_champion_whose_folder_was_removed_is_published_again(env):
    serve_champion(env["root"], "digits", None, None, None)
    _wait_served_nothing(env)
    __import__("shutil").rmtree(env["root"] / "digits" / "1")
    serve_champion(env["root"], "digits", 1, env["models"] / "good0", IMAGE_SPEC)
    _wait_served(env, expected_classes(ROWS, seed=0).tolist(), ["1"])
    serve_champion(env["root"], "digits", 7, env["models"] / "good1", IMAGE_SPEC)
    _wait_served(env, expected_classes(ROWS, seed=1).tolist(), ["7"])


def _wait_served_nothing(env, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with ServingClient("127.0.0.1", env["port"]) as c:
            status, _ = c.request("GET", "/v1/models/digits")
        if status == 404:
            return
        assert time.monotonic() < deadline, "model still served after its config entry went"
        time.sleep(0.2)


def test_stop_local_server_shuts_down_gracefully(env):
    assert stop_local_server(env["root"])
    assert not server_pid_file(env["root"], env["port"]).exists()
    with pytest.raises(OSError):
        ServingClient("127.0.0.1", env["port"], timeout=2).request("GET", "/v1/models/digits")
    assert not stop_local_server(env["root"])
    log = (env["root"] / f".server-{env['port']}.log").read_text()
    assert "model digits version 1 AVAILABLE" in log
    assert "shutting down (finishing in-flight requests)" in log
    assert log.rstrip().endswith("stopped"), log[-500:]


def test_a_server_of_another_checkout_on_the_port_is_named_not_waited_for(tmp_path):
    # a user's other checkout (or an old fresh clone) left its server on the port: the
    # deploy must say so at once instead of waiting for a version that server never reads
    other = tmp_path / "other" / "_serving"
    port = free_port()
    ensure_local_server(other, "127.0.0.1", port)
    try:
        mine = tmp_path / "mine" / "_serving"
        with pytest.raises(DeployError, match=f"taken by another trainyard server .* {other}"):
            ensure_local_server(mine, "127.0.0.1", port)
    finally:
        stop_local_server(other)


def test_stop_stops_the_server_of_every_port(tmp_path) -> None:
    """Found by a new user: with pipelines on two ports, ``make stop`` stopped one server
    (one pid file per serving root, overwritten by the second server)."""
    root = tmp_path / "serving"
    ports = [free_port(), free_port()]
    pids = [ensure_local_server(root, "127.0.0.1", p) for p in ports]
    assert all(pids) and pids[0] != pids[1]
    assert ensure_local_server(root, "127.0.0.1", ports[0]) == pids[0]  # found, not restarted
    assert stop_local_server(root)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert not list(root.glob(".server-*.pid"))
