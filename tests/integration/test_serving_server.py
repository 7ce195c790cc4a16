"""The REST server over real HTTP on 127.0.0.1 with real (tiny) SavedModels."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.serving import (
    IMAGE_SPEC,
    ThreadedServer,
    build_image_model,
    build_table_model,
    expected_classes,
)
from trainyard.serving.client import ServingClient, ServingHTTPError
from trainyard.serving.deploy import publish_version, unpublish_version
from trainyard.serving.versions import SPEC_FILE

RNG = np.random.default_rng(7)
IMAGES = RNG.random((5, 8, 8, 1), dtype=np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SavedModels built once per module (TensorFlow is slow to trace)."""
    root = tmp_path_factory.mktemp("built")
    return {
        "seed0": build_image_model(root / "seed0", seed=0),
        "seed1": build_image_model(root / "seed1", seed=1),
        "pixels": build_image_model(root / "pixels", input_name="pixels"),
        "table": build_table_model(root / "table"),
    }


@pytest.fixture
def served(tmp_path: Path, built: dict[str, Path]):
    base = tmp_path / "serving"
    publish_version(built["seed0"], base, "digits", 1, IMAGE_SPEC)
    shutil.copytree(built["table"], base / "tab" / "3")
    srv = ThreadedServer(base, poll_interval=3600)
    srv.sync()
    client = ServingClient("127.0.0.1", srv.port)
    yield base, srv, client
    client.close()
    srv.stop()


def test_status_metadata_and_predict_formats(served):
    _, _, client = served
    assert client.call("GET", "/v1/models/digits") == {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    assert client.status("digits", 1)[0]["state"] == "AVAILABLE"
    meta = client.metadata("digits")
    assert meta["model_spec"] == {"name": "digits", "signature_name": "", "version": "1"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["image"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sig["inputs"]["image"]["tensor_shape"]["dim"]] == [
        "-1",
        "8",
        "8",
        "1",
    ]
    assert set(sig["outputs"]) == {"probabilities", "class_id"}
    assert sig["outputs"]["class_id"]["dtype"] == "DT_INT64"
    # as TF Serving prints it: the graph's own tensor names, empty fields included
    assert sig["outputs"]["class_id"]["name"].startswith("StatefulPartitionedCall:")
    assert sig["inputs"]["image"]["name"] == "serving_default_image:0"
    assert sig["inputs"]["image"]["tensor_shape"]["unknown_rank"] is False
    assert sig["defaults"] == {} and sig["method_name"] == "tensorflow/serving/predict"

    want = expected_classes(IMAGES, seed=0).tolist()
    rows = client.predict("digits", instances=IMAGES.tolist())
    assert [r["class_id"] for r in rows] == want
    assert all(len(r["probabilities"]) == 10 for r in rows)
    np.testing.assert_allclose([sum(r["probabilities"]) for r in rows], 1.0, rtol=1e-5)
    cols = client.predict("digits", inputs={"image": IMAGES.tolist()}, version=1)
    assert cols["class_id"] == want
    named = client.predict("digits", instances=[{"image": im} for im in IMAGES.tolist()])
    assert named == rows


def test_table_model_with_spec_derived_from_signature(served):
    _, _, client = served
    out = client.predict("tab", instances=[{"a": 2.0, "b": 1.0}, {"a": 0.0, "b": 5.0}])
    assert [r["class_id"] for r in out] == [1, 0]
    meta = client.metadata("tab")
    assert set(meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]) == {
        "a",
        "b",
    }
    with pytest.raises(ServingHTTPError) as exc:
        client.predict("tab", instances=[{"a": 1.0}])
    assert exc.value.status == 400
    assert "instances[0]: missing feature 'b'" in exc.value.message


BAD_REQUESTS = [
    ("malformed json", "POST", "/v1/models/digits:predict", b"{not json", 400, "malformed JSON"),
    ("wrong shape", "POST", "/v1/models/digits:predict",
     json.dumps({"instances": [[[0.0] * 8] * 8]}).encode(), 400,
     "instances[0].image: expected shape (8, 8, 1) per row, got (8, 8)"),
    ("wrong type", "POST", "/v1/models/digits:predict",
     json.dumps({"inputs": {"image": [[[["a"]] * 8] * 8]}}).encode(), 400, "got strings"),
    ("missing field", "POST", "/v1/models/digits:predict", b'{"signature_name": ""}', 400,
     "exactly one of 'instances'"),
    ("unknown model", "POST", "/v1/models/nope:predict", b"{}", 404,
     "Servable not found for request: Latest(nope)"),
    ("unknown version", "POST", "/v1/models/digits/versions/9:predict", b"{}", 404,
     "Specific(digits, 9)"),
    ("bad version", "GET", "/v1/models/digits/versions/x", None, 400, "non-negative integer"),
    ("unknown model status", "GET", "/v1/models/nope", None, 404, "Could not find any versions"),
    # TF Serving answers an unparsable path with InvalidArgument, HTTP 400
    ("unknown path", "GET", "/v2/whatever", None, 400, "Malformed request: GET /v2/whatever"),
    ("classify no examples", "POST", "/v1/models/digits:classify", b"{}", 400,
     "key 'examples' is expected"),
    ("classify a predict signature", "POST", "/v1/models/digits:classify",
     b'{"examples": [{"x": 1}]}', 400,
     "No classification inputs found in SignatureDef: serving_default"),
    ("unknown label", "POST", "/v1/models/digits/labels/beta:predict", b"{}", 400,
     "Unrecognized servable version label: beta"),
    ("unknown verb", "POST", "/v1/models/digits:explain", b"{}", 400, "unsupported method"),
    ("wrong method", "PUT", "/v1/models/digits", b"{}", 405, "use GET or POST"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [c[1:] for c in BAD_REQUESTS],
    ids=[c[0] for c in BAD_REQUESTS],
)
def test_bad_requests_get_tf_serving_errors_and_server_stays_up(
    served, method, path, body, status, message
):
    _, _, client = served
    got, data = client.request(method, path, body)
    assert got == status
    assert message in json.loads(data)["error"]
    assert client.status("digits")[0]["state"] == "AVAILABLE"


@pytest.fixture
def limited(tmp_path, built):
    """A server of digits v1 that refuses request bodies over 50 000 bytes."""
    base = tmp_path / "serving"
    publish_version(built["seed0"], base, "digits", 1, IMAGE_SPEC)
    srv = ThreadedServer(base, poll_interval=3600, max_body_bytes=50_000)
    try:
        srv.sync()
        yield srv
    finally:
        srv.stop()


def test_oversized_body_is_413_and_server_stays_up(limited):
    with ServingClient("127.0.0.1", limited.port) as client:
        big = json.dumps({"instances": np.zeros((200, 8, 8, 1)).tolist()}).encode()
        assert len(big) > 50_000
        status, data = client.request("POST", "/v1/models/digits:predict", big)
        assert status == 413
        assert "exceeds the limit of 50000 bytes" in json.loads(data)["error"]
        assert client.predict("digits", instances=IMAGES[:1].tolist())[0]["class_id"] in range(10)


def test_large_batch_takes_the_fast_paths_and_answers_like_the_json_paths(served):
    _, _, client = served
    images = np.random.default_rng(3).random((300, 8, 8, 1), dtype=np.float32)
    for body in (
        json.dumps({"instances": images.tolist()}),
        json.dumps({"inputs": {"image": images.tolist()}}, separators=(",", ":")),
    ):
        status, data = client.request("POST", "/v1/models/digits:predict", body.encode())
        assert status == 200
        doc = json.loads(data)
        cols = doc.get("outputs") or {
            k: [row[k] for row in doc["predictions"]] for k in ("class_id", "probabilities")
        }
        assert cols["class_id"] == expected_classes(images, seed=0).tolist()
        probs = np.asarray(cols["probabilities"], np.float32)
        assert probs.shape == (300, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def _post_chunked(port: int, chunks: list[bytes]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/models/digits:predict",
            body=iter(chunks),
            headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_chunked_body_is_read_whole_and_held_to_the_size_limit(limited):
    small = json.dumps({"instances": IMAGES.tolist()}).encode()
    status, doc = _post_chunked(limited.port, [small[:100], small[100:]])
    assert status == 200
    assert [p["class_id"] for p in doc["predictions"]] == expected_classes(IMAGES, 0).tolist()
    big = json.dumps({"instances": np.zeros((200, 8, 8, 1)).tolist()}).encode()
    status, doc = _post_chunked(limited.port, [big[i : i + 8192] for i in range(0, len(big), 8192)])
    assert status == 413
    assert "exceeds the limit of 50000 bytes" in doc["error"]


def test_server_sockets_have_tcp_nodelay_and_no_nagle_delay(served):
    """Without TCP_NODELAY, split writes on keep-alive connections wait ~40 ms (delayed ACK)."""
    _, srv, client = served
    client.status("digits")
    handlers = srv.server._runner.server.connections
    assert handlers
    for handler in handlers:
        sock = handler.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    body = json.dumps({"instances": IMAGES[:1].tolist()}).encode()
    times = []
    for _ in range(40):
        t = time.perf_counter()
        status, _ = client.request("POST", "/v1/models/digits:predict", body)
        times.append(time.perf_counter() - t)
        assert status == 200
    assert statistics.median(times) < 0.02, f"median {statistics.median(times) * 1e3:.1f} ms"


def test_new_version_swaps_in_and_removed_version_rolls_back(served, built):
    base, srv, client = served
    publish_version(built["seed1"], base, "digits", 2, IMAGE_SPEC)
    srv.sync()
    assert [(e["version"], e["state"]) for e in client.status("digits")] == [
        ("2", "AVAILABLE"),
        ("1", "END"),
    ]
    out = client.predict("digits", inputs=IMAGES.tolist())
    assert out["class_id"] == expected_classes(IMAGES, seed=1).tolist()
    with pytest.raises(ServingHTTPError) as exc:
        client.predict("digits", inputs=IMAGES.tolist(), version=1)
    assert exc.value.status == 404

    unpublish_version(base, "digits", 2)
    srv.sync()
    assert [(e["version"], e["state"]) for e in client.status("digits")] == [("1", "AVAILABLE")]
    out = client.predict("digits", inputs=IMAGES.tolist())
    assert out["class_id"] == expected_classes(IMAGES, seed=0).tolist()


BROKEN = [
    ("corrupt saved_model.pb", "corrupt", "cannot load SavedModel"),
    ("input renamed", "pixels", "signature inputs ['pixels'] differ from the contract's features"),
    ("no saved_model.pb", "empty", "no saved_model.pb"),
]


@pytest.mark.parametrize(("kind", "message"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_broken_version_reports_error_and_old_version_keeps_serving(served, built, kind, message):
    base, srv, client = served
    target = base / "digits" / "2"
    if kind == "pixels":
        shutil.copytree(built["pixels"], target)
        (target / SPEC_FILE).parent.mkdir()
        (target / SPEC_FILE).write_text(
            json.dumps({"feature_spec": {"image": ["float32", [None, 8, 8, 1]]}})
        )
    elif kind == "corrupt":
        shutil.copytree(built["seed1"], target)
        (target / "saved_model.pb").write_bytes(b"\x00garbage" * 10)
    else:
        target.mkdir(parents=True)
    srv.sync()
    entries = {e["version"]: e for e in client.status("digits")}
    assert entries["1"]["state"] == "AVAILABLE"
    assert entries["2"]["state"] == "END"
    assert entries["2"]["status"]["error_code"] == "UNKNOWN"
    assert message in entries["2"]["status"]["error_message"]
    out = client.predict("digits", inputs=IMAGES.tolist())
    assert out["class_id"] == expected_classes(IMAGES, seed=0).tolist()
    # A fixed directory (new content) is retried.
    shutil.rmtree(target)
    publish_version(built["seed1"], base, "digits", 2, IMAGE_SPEC)
    srv.sync()
    assert client.status("digits", 2)[0]["state"] == "AVAILABLE"


def test_concurrent_requests_are_each_answered_correctly(served):
    _, srv, _ = served
    port = srv.port
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with ServingClient("127.0.0.1", port) as c:
            for _ in range(15):
                imgs = rng.random((3, 8, 8, 1), dtype=np.float32)
                got = c.predict("digits", inputs=imgs.tolist())["class_id"]
                if got != expected_classes(imgs, seed=0).tolist():
                    errors.append(f"client {seed}: {got}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _serve_export(tmp_path, name: str, version: int, spec) -> ThreadedServer:
    """Serve ``<tmp_path>/model`` (an export) as ``name`` version ``version``, loaded."""
    base = tmp_path / "serving"
    publish_version(tmp_path / "model", base, name, version, spec)
    srv = ThreadedServer(base, poll_interval=3600)
    srv.sync()
    return srv


TRAINER_MODELS = [
    ("small_cnn", IMAGE_SPEC, {"image": IMAGES}),
    ("mlp", {"a": ("float32", (None,)), "b": ("float32", (None,))},
     {"a": np.arange(5, dtype=np.float32), "b": np.ones(5, np.float32)}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model_name", "spec", "rows"), TRAINER_MODELS, ids=[c[0] for c in TRAINER_MODELS]
)
def test_serves_savedmodels_exported_by_the_trainer(tmp_path, model_name, spec, rows):
    """The seam with the training worker: its export loads here and answers like in-process."""
    import tensorflow as tf

    from trainyard.training.worker.architectures import ModelSpec, build_model
    from trainyard.training.worker.main import _export

    names = [f"class {i} é" for i in range(10)]  # class names are served as UTF-8 text
    model = build_model(model_name, ModelSpec(inputs=spec, outputs=10, seed=3))
    _export(model, spec, tmp_path / "model", names)
    srv = _serve_export(tmp_path, "m", 4, spec)
    try:
        with ServingClient("127.0.0.1", srv.port) as client:
            assert client.status("m")[0]["state"] == "AVAILABLE"
            got = client.predict("m", inputs={k: v.tolist() for k, v in rows.items()})
            body = {"instances": [{k: v[0].tolist() for k, v in rows.items()}]}
            status, data = client.request("POST", "/v1/models/m:predict", json.dumps(body).encode())
            assert status == 200, data
            rows_form = json.loads(data)
        fn = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
        want = fn(**{k: tf.constant(v) for k, v in rows.items()})
        assert got["class_id"] == want["class_id"].numpy().tolist()
        assert got["class_name"] == [names[i] for i in got["class_id"]]
        assert rows_form["predictions"][0]["class_name"] == names[got["class_id"][0]]
        np.testing.assert_allclose(got["probabilities"], want["probabilities"].numpy(), rtol=1e-6)
    finally:
        srv.stop()


def test_serves_a_regressor_exported_by_the_trainer(tmp_path):
    """A regressor's export: one ``predictions`` number per row, in the target's units."""
    import tensorflow as tf

    from trainyard.training.worker.architectures import ModelSpec, build_model
    from trainyard.training.worker.main import _export

    spec = {"a": ("float32", (None,)), "b": ("float32", (None,))}
    rows = {"a": np.arange(5, dtype=np.float32), "b": np.ones(5, np.float32)}
    model = build_model("mlp", ModelSpec(spec, outputs=1, seed=3, target_stats=(150.0, 5000.0)))
    _export(model, spec, tmp_path / "model", None)
    srv = _serve_export(tmp_path, "r", 1, spec)
    try:
        with ServingClient("127.0.0.1", srv.port) as client:
            got = client.predict("r", inputs={k: v.tolist() for k, v in rows.items()})
            meta = client.metadata("r")
        fn = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
        want = fn(**{k: tf.constant(v) for k, v in rows.items()})["predictions"].numpy()
        assert want.shape == (5,)
        np.testing.assert_allclose(got, want, rtol=1e-6)  # one output: answered bare
        assert 50 < float(np.mean(want)) < 250  # scaled back to the target's units
        outputs = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["outputs"]
        assert list(outputs) == ["predictions"]
    finally:
        srv.stop()


def test_metadata_is_the_saved_models_signature_defs(served, tmp_path):
    """TF Serving's GetModelMetadata (REST) prints the bundle's SignatureDefs.

    Compared with the SavedModel's own protos, printed with every field (as
    http_rest_api_handler_test.cc's expected metadata shows ``"unknown_rank": false``).
    """
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2

    base, _, client = served
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((base / "digits" / "1" / "saved_model.pb").read_bytes())
    want = {
        k: json_format.MessageToDict(
            v, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )
        for k, v in saved.meta_graphs[0].signature_def.items()
    }
    meta = client.metadata("digits")
    assert meta["metadata"]["signature_def"]["signature_def"] == want


def test_a_version_number_beyond_int64_is_not_a_version(tmp_path):
    """As TF Serving: found by a new user, 99999999999999999999 became 'latest' and broke gRPC."""
    from trainyard.serving.versions import scan_versions

    for name in ("1", "9223372036854775807", "9223372036854775808", "99999999999999999999"):
        (tmp_path / name).mkdir()
    assert sorted(scan_versions(tmp_path)) == [1, 2**63 - 1]


def test_a_version_that_failed_half_copied_loads_once_the_copy_completes(tmp_path, built):
    """Found by a new user: a version copied with saved_model.pb first and the variables
    still being written failed to load and stayed END; TF Serving retries."""
    base = tmp_path / "serving"
    src = built["seed0"]
    publish_version(src, base, "digits", 1, IMAGE_SPEC)
    dest = base / "digits" / "2"
    shutil.copytree(src, dest)
    data = next((dest / "variables").glob("variables.data-*"))
    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])
    srv = ThreadedServer(base, poll_interval=3600)
    try:
        srv.sync()
        status = {e["version"]: e for e in srv.server.repository.status("digits")}
        assert status["2"]["state"] == "END" and status["2"]["status"]["error_code"] != "OK"
        srv.sync()  # nothing changed: not tried again
        assert srv.server.repository.get("digits").version == 1
        data.write_bytes(whole)
        srv.sync()
        assert srv.server.repository.get("digits").version == 2
    finally:
        srv.stop()
