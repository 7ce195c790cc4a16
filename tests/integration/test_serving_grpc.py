"""The stock ``tensorflow-serving-api`` gRPC client against ``trainyard serve --grpc-port``.

Cases follow TF Serving's own tests: ``tensorflow_serving/model_servers/
tensorflow_model_server_test.py`` (testPredict, testPredictWithSignatureName-style
signature selection, testGetModelMetadata, testGetModelStatus, testClassify for a model
without a classify signature) and the status codes of ``servables/tensorflow/
predict_util.cc`` (missing/extra inputs, unknown ``output_filter`` alias, unknown
signature) and ``get_model_metadata_impl.cc`` (unsupported metadata field).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tests.support.ports import free_port
from tests.support.serving import IMAGE_SPEC, build_image_model, expected_classes
from trainyard.serving.client import ServingClient
from trainyard.serving.deploy import publish_version
from trainyard.serving.model_config import ALL_MODELS_FILE, set_served

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
ROWS = np.random.default_rng(5).random((4, 8, 8, 1), dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("grpc")
    models, base = root / "models", root / "serving"
    for v, seed in ((1, 0), (2, 1)):
        build_image_model(models / str(v), seed=seed)
        publish_version(models / str(v), base, "digits", v, IMAGE_SPEC)
    set_served(base, "digits", [1, 2], {"stable": 1, "canary": 2})
    port, gport = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(PLUGINS), "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [
        sys.executable, "-m", "trainyard", "serve", "--base-path", str(base),
        "--model-config-file", str(base / ALL_MODELS_FILE), "--port", str(port),
        "--grpc-port", str(gport), "--poll-interval", "0.2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            with ServingClient("127.0.0.1", port, timeout=2) as c:
                states = [e["state"] for e in c.status("digits")]
            if states == ["AVAILABLE", "AVAILABLE"]:
                break
        except Exception:
            pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "server did not load both versions"
        time.sleep(0.2)
    channel = grpc.insecure_channel(f"127.0.0.1:{gport}")
    yield {
        "predict": prediction_service_pb2_grpc.PredictionServiceStub(channel),
        "models": model_service_pb2_grpc.ModelServiceStub(channel),
        "port": port,
        "gport": gport,
        "pid": proc.pid,
        "base": base,
    }
    channel.close()
    proc.terminate()
    proc.wait(timeout=30)


def _request(**spec: object) -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = str(spec.pop("name", "digits"))
    if "version" in spec:
        req.model_spec.version.value = int(spec.pop("version"))  # type: ignore[call-overload]
    if "label" in spec:
        req.model_spec.version_label = str(spec.pop("label"))
    if "signature" in spec:
        req.model_spec.signature_name = str(spec.pop("signature"))
    inputs = spec.pop("inputs", {"image": ROWS})
    for key, value in inputs.items():  # type: ignore[attr-defined]
        req.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    req.output_filter.extend(spec.pop("output_filter", []))  # type: ignore[arg-type]
    return req


def _fails(call, request, code) -> str:
    with pytest.raises(grpc.RpcError) as exc:
        call(request, timeout=30)
    assert exc.value.code() == code, exc.value.details()
    return str(exc.value.details())


def test_predict_answers_as_the_rest_api_does(server) -> None:
    resp = server["predict"].Predict(_request(), timeout=30)
    classes = tf.make_ndarray(resp.outputs["class_id"])
    assert classes.tolist() == expected_classes(ROWS, seed=1).tolist()  # latest: version 2
    assert (resp.model_spec.name, resp.model_spec.version.value) == ("digits", 2)
    assert resp.model_spec.signature_name == "serving_default"
    with ServingClient("127.0.0.1", server["port"]) as c:
        rest = c.predict("digits", inputs={"image": ROWS.tolist()})
    np.testing.assert_allclose(
        tf.make_ndarray(resp.outputs["probabilities"]), rest["probabilities"], rtol=1e-6
    )


@pytest.mark.parametrize(
    ("spec", "version", "seed"),
    [({"version": 1}, 1, 0), ({"label": "stable"}, 1, 0), ({"label": "canary"}, 2, 1)],
    ids=["version", "label-stable", "label-canary"],
)
def test_predict_by_version_and_label(server, spec, version, seed) -> None:
    resp = server["predict"].Predict(_request(**spec), timeout=30)
    assert resp.model_spec.version.value == version
    assert tf.make_ndarray(resp.outputs["class_id"]).tolist() == (
        expected_classes(ROWS, seed=seed).tolist()
    )


def test_output_filter(server) -> None:
    resp = server["predict"].Predict(_request(output_filter=["class_id"]), timeout=30)
    assert list(resp.outputs) == ["class_id"]
    text = _fails(
        server["predict"].Predict,
        _request(output_filter=["logits"]),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "output tensor alias not found in signature: logits" in text


@pytest.mark.parametrize(
    ("spec", "code", "needle"),
    [
        ({"name": "nope"}, "NOT_FOUND", "Servable not found for request: Latest(nope)"),
        ({"version": 9}, "NOT_FOUND", "Specific(digits, 9)"),
        ({"label": "beta"}, "INVALID_ARGUMENT", "Unrecognized servable version label: beta"),
        (
            {"signature": "classify_x"},
            "FAILED_PRECONDITION",
            'Serving signature key "classify_x" not found.',
        ),
        (
            {"inputs": {"pixels": ROWS}},
            "INVALID_ARGUMENT",
            "Sent extra: {pixels}. Missing but required: {image}.",
        ),
        (
            {"inputs": {"image": ROWS.astype(np.float64)}},
            "INVALID_ARGUMENT",
            "Expects arg image to be float32 but float64 is provided",
        ),
        (
            {"inputs": {"image": ROWS[:, :4]}},
            "INVALID_ARGUMENT",
            "input image has shape [4, 4, 8, 1], the signature expects [-1, 8, 8, 1]",
        ),
    ],
    ids=["model", "version", "label", "signature", "input-name", "dtype", "shape"],
)
def test_predict_errors_carry_tf_servings_status_codes(server, spec, code, needle) -> None:
    text = _fails(server["predict"].Predict, _request(**spec), getattr(grpc.StatusCode, code))
    assert needle in text


def test_get_model_metadata_returns_the_saved_models_signature_defs(server) -> None:
    req = get_model_metadata_pb2.GetModelMetadataRequest()
    req.model_spec.name = "digits"
    req.model_spec.version.value = 1
    req.metadata_field.append("signature_def")
    resp = server["predict"].GetModelMetadata(req, timeout=30)
    assert (resp.model_spec.name, resp.model_spec.version.value) == ("digits", 1)
    defs = get_model_metadata_pb2.SignatureDefMap()
    assert resp.metadata["signature_def"].Unpack(defs)
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((server["base"] / "digits" / "1" / "saved_model.pb").read_bytes())
    assert (
        defs.signature_def["serving_default"]
        == (saved.meta_graphs[0].signature_def["serving_default"])
    )
    bad = get_model_metadata_pb2.GetModelMetadataRequest()
    bad.model_spec.name = "digits"
    bad.metadata_field.append("graph_def")
    text = _fails(server["predict"].GetModelMetadata, bad, grpc.StatusCode.INVALID_ARGUMENT)
    assert "Metadata field graph_def is not supported" in text


def test_get_model_status(server) -> None:
    req = get_model_status_pb2.GetModelStatusRequest()
    req.model_spec.name = "digits"
    resp = server["models"].GetModelStatus(req, timeout=30)
    got = [(s.version, s.state, s.status.error_code) for s in resp.model_version_status]
    available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert got == [(2, available, 0), (1, available, 0)]
    req.model_spec.version_label = "stable"  # ignored, as get_model_status_impl.cc does
    resp = server["models"].GetModelStatus(req, timeout=30)
    assert [s.version for s in resp.model_version_status] == [2, 1]
    req.ClearField("model_spec")
    req.model_spec.name = "digits"
    req.model_spec.version.value = 1
    resp = server["models"].GetModelStatus(req, timeout=30)
    assert [s.version for s in resp.model_version_status] == [1]
    req.model_spec.name = "nope"
    _fails(server["models"].GetModelStatus, req, grpc.StatusCode.NOT_FOUND)


def test_classify_on_a_predict_signature_is_refused_as_tf_serving_does(server) -> None:
    """classifier.cc (method names unchecked, TF Serving's default): no ``inputs`` input."""
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = "digits"
    details = _fails(server["predict"].Classify, req, grpc.StatusCode.INVALID_ARGUMENT)
    assert details == "No classification inputs found in SignatureDef: serving_default"
    req.model_spec.signature_name = "nope"
    details = _fails(server["predict"].Classify, req, grpc.StatusCode.INVALID_ARGUMENT)
    assert details == "No signature was found with the name: nope"


def test_a_tiny_request_cannot_make_the_server_build_a_huge_tensor(server) -> None:
    """A TensorProto repeats its last value to fill its shape: 37 bytes could ask for GBs.

    Found by a new user: shape [67108864, 3] with one float took 4 s and 786 MB of RSS,
    kept, before the row limit answered. The shape is checked before anything is built.
    """
    import psutil

    rss = psutil.Process(server["pid"]).memory_info().rss
    for dims, message in (
        ([67108864, 8, 8, 1], "batch of 67108864 rows exceeds the limit"),
        ([60000, 4096, 8, 1], "more than this server builds"),
        ([-5, 8, 8, 1], "invalid shape"),
    ):
        req = _request()
        proto = req.inputs["image"]
        proto.ClearField("tensor_content")
        proto.ClearField("float_val")
        proto.float_val.append(7.0)
        del proto.tensor_shape.dim[:]
        for d in dims:
            proto.tensor_shape.dim.add(size=d)
        t = time.monotonic()
        details = _fails(server["predict"].Predict, req, grpc.StatusCode.INVALID_ARGUMENT)
        assert message in details and time.monotonic() - t < 2, details
    assert psutil.Process(server["pid"]).memory_info().rss < rss + 50 * 2**20


def test_a_second_server_cannot_take_the_grpc_port(server, tmp_path) -> None:
    """gRPC's default SO_REUSEPORT let a second server share the port and answer NOT_FOUND."""
    from tests.support.serving import ThreadedServer

    with pytest.raises(OSError, match="cannot listen for gRPC"):
        ThreadedServer(tmp_path, grpc_port=server["gport"])
