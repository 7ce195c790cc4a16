"""TF Serving's own test cases, ported: string and b64 tensors, signatures, classify/regress.

Each test names the case it ports from tensorflow/serving:

* ``tensorflow_serving/util/json_tensor_test.cc`` (``JsontensorTest.*``,
  ``ClassifyRegressRequestTest.*``): decoding requests and encoding responses;
* ``tensorflow_serving/model_servers/http_rest_api_handler_test.cc`` and
  ``tensorflow_model_server_test.py`` (``testClassify``, ``testRegress``,
  ``testPredict`` with ``signature_name``): the same over a real server process's HTTP and
  gRPC, with real SavedModels (a TF 2 module with string inputs and several signatures, a
  TF 1 ``tf.Example`` model with classify and regress signatures).
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np
import pytest

from tests.support.serving import (
    ThreadedServer,
    build_example_model,
    build_half_plus_two,
    build_text_model,
)
from trainyard.serving.classify_regress import decode_example_request
from trainyard.serving.client import ServingClient
from trainyard.serving.schema import (
    InvalidRequest,
    decode_predict_request,
    decode_request,
    encode_predict_response,
)


def _b(text: str) -> dict[str, str]:
    return {"b64": base64.b64encode(text.encode()).decode()}


# ---- json_tensor_test.cc: requests ------------------------------------------------------


def test_single_unnamed_tensor_base64_scalars():
    """JsontensorTest.SingleUnnamedTensorBase64Scalars."""
    spec = {"default": ("string", (None,))}
    body = b'{"instances": [ { "b64" : "aGVsbG8=" }, { "b64": "d29ybGQ=" } ]}'
    inputs, rows, columnar = decode_predict_request(body, spec)
    assert (rows, columnar) == (2, False)
    assert inputs["default"].tolist() == [b"hello", b"world"]


def test_single_unnamed_tensor_base64_lists():
    """JsontensorTest.SingleUnnamedTensorBase64Lists."""
    spec = {"default": ("string", (None, 1))}
    body = b'{"instances": [ [{ "b64" : "aGVsbG8=" }], [{ "b64": "d29ybGQ=" }] ]}'
    inputs, _, _ = decode_predict_request(body, spec)
    assert inputs["default"].shape == (2, 1)
    assert inputs["default"].tolist() == [[b"hello"], [b"world"]]


def test_single_named_tensor_base64():
    """JsontensorTest.SingleNamedTensorBase64."""
    spec = {"default": ("string", (None, 2, 1))}
    body = b'{"instances": [{"default": [ [{ "b64" : "aGVsbG8=" }], [{ "b64": "d29ybGQ=" }] ]}]}'
    inputs, _, _ = decode_predict_request(body, spec)
    assert inputs["default"].shape == (1, 2, 1)
    assert inputs["default"].reshape(-1).tolist() == [b"hello", b"world"]


def test_multiple_named_tensor():
    """JsontensorTest.MultipleNamedTensor: int, string, float (NaN, Infinity), double."""
    spec = {
        "int_tensor": ("int32", (None, 3, 2)),
        "str_tensor": ("string", (None, 2)),
        "float_tensor": ("float32", (None, 2)),
        "dbl_tensor": ("float64", (None, 1)),
    }
    body = b"""{"instances": [
        {"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"],
         "float_tensor": [1.0, NaN], "dbl_tensor": [NaN]},
        {"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"],
         "float_tensor": [2.0, Infinity], "dbl_tensor": [2.0]}]}"""
    inputs, rows, _ = decode_predict_request(body, spec)
    assert rows == 2
    assert inputs["int_tensor"].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert inputs["str_tensor"].tolist() == [[b"foo", b"bar"], [b"baz", b"bat"]]
    f = inputs["float_tensor"]
    assert f.dtype == np.float32 and f[0, 0] == 1.0 and math.isnan(f[0, 1]) and f[1, 1] == np.inf
    assert inputs["dbl_tensor"].dtype == np.float64 and inputs["dbl_tensor"][1, 0] == 2.0


def test_multiple_named_tensor_columnar_format():
    """JsontensorTest.MultipleNamedTensorColumnarFormat: inputs of unknown rank (a
    TensorInfo with a dtype alone) take any shape, a scalar ``{"b64": ...}`` too, and
    need not agree on a first dimension."""
    spec = {
        "int_tensor": ("int32", None),
        "str_tensor": ("string", None),
        "bin_tensor": ("string", None),
    }
    body = b"""{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]], "str_tensor": ["foo", "bar"],
        "bin_tensor": { "b64" : "aGVsbG8=" }}}"""
    inputs, rows, columnar = decode_predict_request(body, spec)
    assert (rows, columnar) == (1, True)
    assert inputs["int_tensor"].shape == (1, 3, 2) and inputs["int_tensor"].dtype == np.int32
    assert inputs["int_tensor"].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6]
    assert inputs["str_tensor"].tolist() == [b"foo", b"bar"]
    assert inputs["bin_tensor"].shape == () and inputs["bin_tensor"].item() == b"hello"
    # a single input's b64 object is a value, not a map of named inputs
    one = {"bin_tensor": ("string", (None,))}
    inputs, _, _ = decode_predict_request(b'{"inputs": [{"b64": "aGVsbG8="}]}', one)
    assert inputs["bin_tensor"].tolist() == [b"hello"]


@pytest.mark.parametrize(
    ("spec", "body", "message"),
    [
        # JsontensorTest.SingleUnnamedTensorErrors: signature_name must be a string
        (
            {"default": ("int32", (None, 2))},
            b'{"signature_name": 5, "instances": [[1,2]]}',
            "must be a string value",
        ),
        # strings where numbers are expected, numbers where strings are
        ({"default": ("int32", (None, 2))}, b'{"instances": [[1,2],["a", "b"]]}', "strings"),
        ({"default": ("string", (None,))}, b'{"instances": ["a", 1]}', "expected strings"),
        # no missing value in an integer input (a float's is null or NaN, a string's "")
        ({"default": ("int32", (None,))}, b'{"instances": [1, null]}', "null"),
        # a b64 object that is not base64, or has another key beside b64
        ({"default": ("string", (None,))}, b'{"instances": [{"b64": "!!!"}]}', "base64 decode"),
        (
            {"default": ("string", (None,))},
            b'{"instances": [{"b64": "aGk=", "x": 1}]}',
            'a {"b64": ...} object holds the key b64 alone',
        ),
        ({"default": ("string", (None, 2))}, b'{"instances": [["a", "b"], ["c"]]}', "shape"),
    ],
    ids=["signature not a string", "strings for ints", "int for string", "null integer",
         "bad base64", "b64 with another key", "ragged strings"],
)  # fmt: skip
def test_request_errors(spec, body, message):
    with pytest.raises(InvalidRequest, match=message):
        decode_predict_request(body, spec)


def test_signature_name_picks_the_input_spec():
    """The body's signature_name decides which inputs are expected."""
    specs = {"": {"a": ("float32", (None,))}, "other": {"t": ("string", (None,))}}

    def lookup(name: str):
        if name not in specs:
            raise InvalidRequest(f'Serving signature key "{name}" not found.')
        return specs[name]

    got = decode_request(b'{"signature_name": "other", "instances": ["x"]}', lookup)
    assert got.signature == "other" and got.inputs["t"].tolist() == [b"x"]
    with pytest.raises(InvalidRequest, match='key "nope" not found'):
        decode_request(b'{"signature_name": "nope", "instances": [1]}', lookup)


INT_ANY = {"default": ("int32", None)}
FLOAT_ANY = {"default": ("float32", None)}
DOUBLE_ANY = {"default": ("float64", None)}


def test_single_unnamed_tensor():
    """JsontensorTest.SingleUnnamedTensor and ...WithSignature (row format)."""
    inputs, rows, columnar = decode_predict_request(
        b'{"signature_name": "serving_default", "instances": [[1,2],[3,4],[5,6]]}', INT_ANY
    )
    assert (rows, columnar) == (3, False)
    assert inputs["default"].dtype == np.int32
    assert inputs["default"].tolist() == [[1, 2], [3, 4], [5, 6]]


def test_single_unnamed_tensor_columnar_format():
    """JsontensorTest.SingleUnnamedTensorColumnarFormat, named and bare."""
    spec = {"int_tensor": ("int32", None)}
    for body in (
        b'{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]]}}',
        b'{"inputs": [[[1,2],[3,4],[5,6]]]}',
    ):
        inputs, rows, columnar = decode_predict_request(body, spec)
        assert (rows, columnar, inputs["int_tensor"].shape) == (1, True, (1, 3, 2))


@pytest.mark.parametrize(
    ("spec", "body", "want"),
    [
        (FLOAT_ANY, b'{"instances": [1, 2.0, 3, 4, 5.003, 0.007, 0.0]}',
         np.array([1, 2, 3, 4, 5.003, 0.007, 0], np.float32)),
        (DOUBLE_ANY, b'{"instances": [1.0, 2, 3, 4, 0.662, 0, 0.0]}',
         np.array([1, 2, 3, 4, 0.662, 0, 0], np.float64)),
        (FLOAT_ANY, b'{"instances": [1435774380]}', np.array([1435774380], np.float32)),
        (FLOAT_ANY, b'{"instances": [1435774380.0]}', np.array([1435774380.0], np.float32)),
    ],
    ids=["MixedInputForFloatTensor", "MixedInputForDoubleTensor",
         "FloatTensorWithPrecisionLoss int", "FloatTensorWithPrecisionLoss float"],
)  # fmt: skip
def test_mixed_numbers_for_a_float_input(spec, body, want):
    """JsontensorTest.MixedInputFor{Float,Double}Tensor, FloatTensorWithPrecisionLoss."""
    got = decode_predict_request(body, spec)[0]["default"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_float_beyond_float32_becomes_infinity_and_below_becomes_zero():
    """JsontensorTest.FloatTensorThatExceedsMaxReturnsInf and ...ExceedsMinReturnsZero."""
    big, tiny = np.finfo(np.float64).max, np.finfo(np.float64).tiny
    for value, want in ((big, np.inf), (-big, -np.inf), (tiny, 0.0), (-tiny, -0.0)):
        body = json.dumps({"instances": [value]}).encode()
        got = decode_predict_request(body, FLOAT_ANY)[0]["default"]
        assert got.tolist() == [want] and np.signbit(got[0]) == np.signbit(want)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"instances": [1.0]}', "1.0 is not of expected type int64"),
        (b'{"instances": [1e3]}', "1000.0 is not of expected type int64"),
        (b'{"inputs": [true]}', "expected int64 numbers, got booleans"),
        (b'{"inputs": [9223372036854775808]}', "value out of range for int64"),
    ],
    ids=["1.0", "1e3", "true", "2**63"],
)
def test_an_int64_input_takes_json_integers_only(body, message):
    """AddValueToTensor for DT_INT64: ``val.IsInt64()`` or "not of expected type"."""
    spec = {"n": ("int64", None)}
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        decode_predict_request(body, spec)
    assert decode_predict_request(b'{"instances": [-9223372036854775808, 7]}', spec)[0][
        "n"
    ].tolist() == [-(2**63), 7]


def test_an_empty_columnar_batch_is_an_empty_tensor():
    """FillTensorMapFromInputsMap: ``[]`` is a tensor of shape [0] (GetDenseTensorShape)."""
    inputs, rows, columnar = decode_predict_request(
        b'{"inputs": {"x": []}}', {"x": ("float32", (None,))}
    )
    assert (inputs["x"].shape, inputs["x"].dtype, rows, columnar) == ((0,), np.float32, 0, True)
    inputs, _, _ = decode_predict_request(b'{"inputs": [[], []]}', {"s": ("string", (None, None))})
    assert inputs["s"].shape == (2, 0)


@pytest.mark.parametrize(
    ("spec", "body", "message"),
    [
        (INT_ANY, b'{"instances": [[1,2],[3,4],[5,6]], "inputs": [[1,2],[3,4],[5,6]]}',
         "exactly one of 'instances' (row format) or 'inputs'"),
        (INT_ANY, b'{"instances": [[1,2],[3,4],[5,6,7]]}', "ragged nested lists"),
        (INT_ANY, b'{"instances": [[1,2],[3,4],[[5,6]]]}', "ragged nested lists"),
        (INT_ANY, b'{"instances": [1, [1]]}', "ragged nested lists"),
        (INT_ANY, b'{"instances": [[1,2],["a", "b"]]}', "expected int32 numbers, got strings"),
        ({"int_tensor": ("int32", None), "str_tensor": ("string", None)},
         b'{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]},'
         b' {"int_tensor": [[[7,8],[9,0],[1,2]]], "str_tensor": ["baz", "bat"]}]}',
         "ragged nested lists"),
        ({"int_tensor": ("int32", None), "str_tensor": ("string", None)},
         b'{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]},'
         b' [1, 20, 30]]}', "instances[1]: expected an object"),
        ({"str_tensor": ("string", None)},
         b'{"instances": [["baz", "bar"], {"str_tensor": ["baz", "bat"]}]}',
         "instances[1]: mixes objects and bare values"),
    ],
    ids=["both formats", "tensor size", "shape", "scalar and list", "type",
         "named shape", "object then list", "list then object"],
)  # fmt: skip
def test_single_and_multiple_named_tensor_errors(spec, body, message):
    """JsontensorTest.SingleUnnamedTensorErrors and MultipleNamedTensorErrors (our words)."""
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        decode_predict_request(body, spec)


def test_deep_nesting_is_refused_by_name():
    """JsontensorTest.DeeplyNested*: TF Serving's parser is iterative and reads 500,000
    levels; this one stops at about 1,000 (a documented divergence) with a 400 that says so."""
    deep = b'{"instances": [1], "nested": ' + b"[" * 500_000 + b"]" * 500_000 + b"}"
    with pytest.raises(InvalidRequest, match="JSON nested too deeply"):
        decode_predict_request(deep, INT_ANY)
    rank = b'{"inputs": ' + b"[" * 65 + b"1" + b"]" * 65 + b"}"
    with pytest.raises(InvalidRequest, match="65 levels of nested lists, at most 64"):
        decode_predict_request(rank, INT_ANY)


# ---- json_tensor_test.cc: responses -----------------------------------------------------


def _strings(rows: list[list[str]]) -> np.ndarray:
    arr = np.empty((len(rows), len(rows[0])), dtype=object)
    arr[:] = [[v.encode() for v in r] for r in rows]
    return arr


def test_from_json_single_bytes_tensor():
    """JsontensorTest.FromJsonSingleBytesTensor: *_bytes outputs are written as b64."""
    out = {"str_tensor_bytes": _strings([["hello", "world"], ["tf", "serving"]])}
    assert json.loads(encode_predict_response(out, columnar=False)) == {
        "predictions": [
            [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
            [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
        ]
    }


def test_from_json_multiple_named_tensors():
    """JsontensorTest.FromJsonMultipleNamedTensors, row and columnar."""
    out = {
        "int_tensor": np.array([[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]], np.int32),
        "str_tensor": _strings([["foo", "bar"], ["baz", "bat"]]),
        "float_tensor": np.array([[1.0], [2.0]], np.float32),
        "double_scalar_tensor": np.array([8.0, 9.0]),
        "str_tensor_bytes": _strings([["hello", "world"], ["tf", "serving"]]),
    }
    assert json.loads(encode_predict_response(out, columnar=False)) == {
        "predictions": [
            {
                "double_scalar_tensor": 8.0,
                "float_tensor": [1.0],
                "int_tensor": [[1, 2], [3, 4], [5, 6]],
                "str_tensor": ["foo", "bar"],
                "str_tensor_bytes": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
            },
            {
                "double_scalar_tensor": 9.0,
                "float_tensor": [2.0],
                "int_tensor": [[7, 8], [9, 0], [1, 2]],
                "str_tensor": ["baz", "bat"],
                "str_tensor_bytes": [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
            },
        ]
    }
    assert json.loads(encode_predict_response(out, columnar=True)) == {
        "outputs": {
            "double_scalar_tensor": [8.0, 9.0],
            "float_tensor": [[1.0], [2.0]],
            "int_tensor": [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]],
            "str_tensor": [["foo", "bar"], ["baz", "bat"]],
            "str_tensor_bytes": [
                [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
                [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
            ],
        }
    }


def test_from_json_tensor_errors():
    """JsontensorTest.FromJsonMultipleNamedTensorsErrors and FromJsonSingleTensorErrors."""
    out = {"int_tensor": np.ones((2, 3), np.int32), "str_tensor": _strings([["a", "b", "c"]])}
    with pytest.raises(InvalidRequest, match="inconsistent batch size"):
        encode_predict_response(out, columnar=False)
    with pytest.raises(InvalidRequest, match="no shape information"):
        encode_predict_response({"tensor": np.array(1, np.int32)}, columnar=False)
    # the columnar format writes them as they are
    assert json.loads(encode_predict_response(out, columnar=True))["outputs"]["str_tensor"] == [
        ["a", "b", "c"]
    ]


def test_from_json_zero_batch_tensors():
    """JsontensorTest.FromJsonSingleZeroBatchTensor, ...MultipleZeroBatchTensors(Errors)."""
    one = {"int_tensor": np.zeros((0, 2), np.int32)}
    assert json.loads(encode_predict_response(one, columnar=False)) == {"predictions": []}
    two = {
        "str_tensor": np.zeros((0, 1, 2), dtype=object),
        "float_tensor": np.zeros((0, 3, 4), np.float32),
    }
    assert json.loads(encode_predict_response(two, columnar=False)) == {"predictions": []}
    assert json.loads(encode_predict_response({"y": np.zeros(0, np.float32)}, True)) == {
        "outputs": []
    }
    bad = {"int_tensor": np.zeros((0, 2), np.int32), "str_tensor": _strings([["foo", "bar"]])}
    with pytest.raises(InvalidRequest, match="inconsistent batch size"):
        encode_predict_response(bad, columnar=False)


# ---- json_tensor_test.cc: classify / regress requests -----------------------------------


def _features(serialized: bytes) -> dict[str, list]:
    from tensorflow.core.example import example_pb2

    ex = example_pb2.Example.FromString(serialized)
    out = {}
    for name, f in ex.features.feature.items():
        kind = f.WhichOneof("kind")
        out[name] = (kind, list(getattr(f, kind).value)) if kind else (None, [])
    return out


def test_classify_regress_request_no_context():
    """ClassifyRegressRequestTest.RequestNoContext."""
    body = b"""{"examples": [
        {"names": [ "foo", "bar" ], "ratings": [ 8.0, 9.0 ], "age": 20},
        {"names": [ "baz" ], "ratings": 6.0}]}"""
    req = decode_example_request(body, "classify", 100)
    assert req.signature == "" and req.rows == 2
    assert _features(req.examples[0]) == {
        "names": ("bytes_list", [b"foo", b"bar"]),
        "ratings": ("float_list", [8.0, 9.0]),
        "age": ("int64_list", [20]),
    }
    assert _features(req.examples[1]) == {
        "names": ("bytes_list", [b"baz"]),
        "ratings": ("float_list", [6.0]),
    }


def test_classify_regress_request_with_context_and_signature():
    """ClassifyRegressRequestTest.RequestWithContextAndSignature (context merged in)."""
    body = b"""{"signature_name": "custom_signture",
      "context": {"query": "pizza", "location": [ "sfo" ]},
      "examples": [
        {"names": [ "foo", "bar" ], "ratings": [ 8.0, 9.0, NaN, Infinity ], "age": 20},
        {"names": [ "baz", { "b64": "aGVsbG8=" } ], "ratings": 6.0,
         "intboolmix": [ 1, true, false ]},
        {"names": "bar", "ratings": -Infinity, "query": "pasta"}]}"""
    req = decode_example_request(body, "regress", 100)
    assert req.signature == "custom_signture" and req.rows == 3
    first = _features(req.examples[0])
    assert first["query"] == ("bytes_list", [b"pizza"])
    assert first["location"] == ("bytes_list", [b"sfo"])
    kind, ratings = first["ratings"]
    assert kind == "float_list" and ratings[:2] == [8.0, 9.0] and math.isnan(ratings[2])
    assert ratings[3] == math.inf
    second = _features(req.examples[1])
    assert second["names"] == ("bytes_list", [b"baz", b"hello"])
    assert second["intboolmix"] == ("int64_list", [1, 1, 0])
    third = _features(req.examples[2])
    assert third["ratings"] == ("float_list", [-math.inf])
    assert third["query"] == ("bytes_list", [b"pasta"])  # the example's own value wins


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"signature_name": [ "hello" ], "examples": [ { "names": [ "foo" ] } ]}',
         "'signature_name' key must be a string"),
        (b'{"context": [ { "names": [ "foo", "bar" ] } ]}', "Example must be JSON object"),
        (b'{"examples": { "names": [ "foo", "bar" ] }}', "list/array"),
        (b'{"examples": [ [ { "names": [ "foo", "bar" ] } ] ]}', "Example must be JSON object"),
        (b'{"examples": [ { "names": [ 10, null ] } ]}',
         "names has element with unexpected JSON type: Null"),
        (b'{"examples": [ { "names": [ 10, 10.0 ] } ]}', "feature: names expecting type: int64"),
        (b'{"examples": [ { "names": [ 10, { "test": 10 } ] } ]}',
         "names has element with unexpected JSON type: Object"),
        (b'{"examples": [ { "names": [ 10, [ 10 ] ] } ]}',
         "names has element with unexpected JSON type: Array"),
        (b'{"examples": [ { "names": [ 20, 18446744073709551603 ] } ]}',
         "names has uint64_t element. Only int64_t is supported"),
        (b'{"examples": []}', "empty array"),
        (b'{"context": {}}', "key 'examples' is expected"),
    ],
    ids=["signature", "context list", "examples object", "nested example", "null", "int float mix",
         "object", "array", "uint64", "empty", "missing"],
)  # fmt: skip
def test_classify_regress_request_json_errors(body, message):
    """ClassifyRegressRequestTest.JsonErrors."""
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        decode_example_request(body, "classify", 100)


def test_an_example_float_beyond_float32_is_infinity():
    """AddValueToFeature: a float_list value is ``val.GetFloat()``, so 1e39 becomes inf."""
    req = decode_example_request(b'{"examples": [{"x": [1e39, -1e39, 0.5]}]}', "regress", 100)
    assert _features(req.examples[0]) == {"x": ("float_list", [math.inf, -math.inf, 0.5])}


# ---- the server: real SavedModels over HTTP and gRPC ------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("conformance") / "serving"
    build_text_model(base / "text" / "1")
    build_text_model(base / "nodefault" / "1", default=False)
    build_example_model(base / "census" / "1")
    srv = ThreadedServer(base, poll_interval=3600, grpc_port=0)
    srv.sync()
    client = ServingClient("127.0.0.1", srv.port)
    yield srv, client
    client.close()
    srv.stop()


def _post(client: ServingClient, path: str, doc: dict) -> tuple[int, dict]:
    status, data = client.request("POST", path, json.dumps(doc).encode())
    return status, json.loads(data)


def test_string_inputs_and_bytes_outputs_over_http(server):
    """tensorflow_model_server_test.py's predict on a string model; b64 in and out."""
    _, client = server
    status, doc = _post(client, "/v1/models/text:predict", {"instances": ["héllo", _b("tf")]})
    assert status == 200, doc
    assert doc == {
        "predictions": [
            {"length": 5, "upper": "HéLLO", "upper_bytes": {"b64": _b("HéLLO")["b64"]}},
            {"length": 2, "upper": "TF", "upper_bytes": _b("TF")},
        ]
    }
    status, doc = _post(client, "/v1/models/text:predict", {"inputs": {"text": ["a"]}})
    assert doc == {"outputs": {"length": [1], "upper": ["A"], "upper_bytes": [_b("A")]}}


def test_signature_name_runs_that_signature(server):
    """http_rest_api_handler_test.cc's predict with signature_name; binary bytes in b64."""
    _, client = server
    jpeg_head = base64.b64encode(b"\xff\xd8\xff\xe0\x00\x10JFIF").decode()
    status, doc = _post(
        client,
        "/v1/models/text/versions/1:predict",
        {"signature_name": "byte_size", "instances": [{"b64": jpeg_head}]},
    )
    assert (status, doc) == (200, {"predictions": [10]})
    status, doc = _post(
        client, "/v1/models/text:predict", {"signature_name": "nope", "instances": ["a"]}
    )
    assert (status, doc) == (
        400,
        {"error": 'Serving signature name: "nope" not found in signature def'},
    )


def test_unbatched_output_is_served_in_the_columnar_format(server):
    """An output without a batch dimension: columnar gives it whole, rows cannot."""
    _, client = server
    body = {"signature_name": "totals", "inputs": [[1.0, 2.0], [3.0, 4.5]]}
    status, doc = _post(client, "/v1/models/text:predict", body)
    assert (status, doc) == (200, {"outputs": {"row_sum": [3.0, 7.5], "total": 10.5}})
    rows = {"signature_name": "totals", "instances": [[1.0, 2.0]]}
    status, doc = _post(client, "/v1/models/text:predict", rows)
    assert status == 400 and "Tensor name: total has no shape information" in doc["error"]


def test_classify_and_regress_over_http(server):
    """tensorflow_model_server_test.py testClassify / testRegress, over REST."""
    _, client = server
    examples = [{"x": [1.0, 2.0]}, {"x": [-1.0, 0.5], "weight": 3}]
    status, doc = _post(client, "/v1/models/census:classify", {"examples": examples})
    assert status == 200, doc
    (r0, r1) = doc["results"]
    assert [label for label, _ in r0] == ["neg", "pos"]
    s = 3.0
    assert r0[1][1] == pytest.approx(math.exp(s) / (math.exp(s) + math.exp(-s)), rel=1e-6)
    assert r1[0][1] == pytest.approx(1 / (1 + math.exp(-1.0)), rel=1e-6)
    status, doc = _post(
        client,
        "/v1/models/census:regress",
        {"signature_name": "regress", "context": {"weight": 2}, "examples": examples},
    )
    assert status == 200, doc
    assert doc["results"] == pytest.approx([(2 * 1 + 2) * 2, (2 * -1 + 0.5) * 3])
    status, doc = _post(
        client,
        "/v1/models/census:classify",
        {"signature_name": "scores_only", "examples": examples},
    )
    assert [label for label, _ in doc["results"][0]] == ["", ""]
    # a classification signature (two outputs) cannot regress (regressor.cc's check)
    status, doc = _post(client, "/v1/models/census:regress", {"examples": examples})
    assert (status, doc) == (400, {"error": "Expected one output Tensor."})


def test_predict_runs_any_signature_with_serialized_examples(server):
    """A predict on a predict signature that takes serialized tf.Example (b64)."""
    from tensorflow.core.example import example_pb2

    _, client = server
    ex = example_pb2.Example()
    ex.features.feature["x"].float_list.value.extend([0.25, 4.0])
    b64 = base64.b64encode(ex.SerializeToString()).decode()
    status, doc = _post(
        client,
        "/v1/models/census:predict",
        {"signature_name": "parse", "instances": [{"b64": b64}]},
    )
    assert (status, doc) == (200, {"predictions": [[0.25, 4.0]]})


def test_grpc_classify_regress_and_string_predict(server):
    """tensorflow_model_server_test.py testClassify / testRegress / testPredict over gRPC."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (
        classification_pb2,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    srv, _ = server
    with grpc.insecure_channel(f"127.0.0.1:{srv.server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        req = classification_pb2.ClassificationRequest()
        req.model_spec.name = "census"
        ex = req.input.example_list.examples.add()
        ex.features.feature["x"].float_list.value.extend([1.0, 2.0])
        got = stub.Classify(req, timeout=30)
        assert got.model_spec.signature_name == "serving_default"
        classes = got.result.classifications[0].classes
        assert [c.label for c in classes] == ["neg", "pos"]
        assert classes[1].score == pytest.approx(math.exp(3) / (math.exp(3) + math.exp(-3)))

        reg = regression_pb2.RegressionRequest()
        reg.model_spec.name = "census"
        reg.model_spec.signature_name = "regress"
        ctx = reg.input.example_list_with_context
        ctx.context.features.feature["weight"].int64_list.value.append(2)
        ctx.examples.add().features.feature["x"].float_list.value.extend([1.0, 2.0])
        got = stub.Regress(reg, timeout=30)
        assert [r.value for r in got.result.regressions] == [pytest.approx(8.0)]

        reg.model_spec.signature_name = ""
        with pytest.raises(grpc.RpcError) as err:
            stub.Regress(reg, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "Expected one output Tensor."

        pred = predict_pb2.PredictRequest()
        pred.model_spec.name = "text"
        pred.model_spec.signature_name = "byte_size"
        pred.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([b"\xff\x00abc"]))
        got = stub.Predict(pred, timeout=30)
        assert tf.make_ndarray(got.outputs["size"]).tolist() == [5]
        assert got.model_spec.signature_name == "byte_size"


def test_a_model_without_serving_default_serves_the_signatures_it_names(server):
    """TF Serving loads such a model; a request must name a signature (large bodies too)."""
    _, client = server
    status, doc = _post(client, "/v1/models/nodefault:predict", {"instances": ["a"]})
    assert (status, doc) == (
        400,
        {"error": 'Serving signature name: "serving_default" not found in signature def'},
    )
    rows = [[float(i), 1.0] for i in range(2000)]  # beyond the fast path's minimum size
    status, doc = _post(
        client, "/v1/models/nodefault:predict", {"inputs": rows, "signature_name": "totals"}
    )
    assert status == 200, doc
    assert doc["outputs"]["total"] == sum(range(2000)) + 2000
    status, doc = _post(
        client, "/v1/models/nodefault:predict", {"signature_name": "text", "instances": ["ab"]}
    )
    assert doc["predictions"][0]["length"] == 2
    status, _ = client.request("GET", "/v1/models/nodefault/metadata")
    assert status == 200


def test_a_model_error_is_the_ops_message_without_the_servers_stack(server):
    """Found by a new user: a 400 carried 850 bytes of Python stack with server paths."""
    _, client = server
    status, doc = _post(client, "/v1/models/census:classify", {"examples": [{"weight": 2}]})
    assert status == 400
    assert "Feature: x (data type: float) is required but could not be found" in doc["error"]
    assert 'File "' not in doc["error"] and "Detected at node" not in doc["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"instances": [{"b64": 5}]}, 'a {"b64": ...} object holds the key b64 alone'),
        ({"instances": [{"b64": None}]}, 'a {"b64": ...} object holds the key b64 alone'),
        ({"instances": [{"b64": "YWJj", "x": 1}]}, 'a {"b64": ...} object holds the key b64'),
    ],
)
def test_a_malformed_b64_object_is_named(server, body, message):
    """Found by a new user: these answered "missing feature 'image_bytes'"."""
    _, client = server
    status, doc = _post(client, "/v1/models/text:predict", {"signature_name": "byte_size", **body})
    assert status == 400 and message in doc["error"], doc


def test_an_object_among_numbers_is_named(server):
    _, client = server
    body = {"signature_name": "totals", "instances": [[1.0, {"b64": "YWJj"}]]}
    status, doc = _post(client, "/v1/models/text:predict", body)
    assert status == 400 and "expected float32 numbers, got an object" in doc["error"], doc


# ---- half_plus_two: TF Serving's test model, exported here with plain TensorFlow 2 ----------


@pytest.fixture(scope="module")
def half(tmp_path_factory: pytest.TempPathFactory):
    """``half_plus_two`` version 123 labelled ``Version_Label`` (as in
    http_rest_api_handler_test.cc), and ``two`` serving versions 1 and 2 (stable, canary)."""
    import shutil

    from trainyard.serving.model_config import ALL_MODELS_FILE, set_served

    base = tmp_path_factory.mktemp("half") / "serving"
    build_half_plus_two(base / "half_plus_two" / "123")
    set_served(base, "half_plus_two", [123], {"Version_Label": 123})
    for v in (1, 2):
        shutil.copytree(base / "half_plus_two" / "123", base / "two" / str(v))
    set_served(base, "two", [1, 2], {"stable": 1, "canary": 2})
    srv = ThreadedServer(base, poll_interval=3600, grpc_port=0, config_file=base / ALL_MODELS_FILE)
    srv.sync()
    client = ServingClient("127.0.0.1", srv.port)
    yield srv, client
    client.close()
    srv.stop()


HALF = "/v1/models/half_plus_two"


@pytest.mark.parametrize(
    ("path", "body", "want"),
    [
        # tensorflow_model_server_test.py: testPredictREST, testPredictColumnarREST
        (":predict", {"instances": [2.0, 3.0, 4.0]}, {"predictions": [3.0, 3.5, 4.0]}),
        (":predict", {"inputs": [2.0, 3.0, 4.0]}, {"outputs": [3.0, 3.5, 4.0]}),
        # testClassifyREST, testRegressREST: a TF 2 export's classify/regress signatures
        (":classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]},
         {"results": [[["", 3.0]]]}),
        (":regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]},
         {"results": [3.0]}),
        # http_rest_api_handler_test.cc: Predict, Regress, Classify by version and by label
        ("/versions/123:predict", {"instances": [1.0, 2.0]}, {"predictions": [2.5, 3.0]}),
        ("/labels/Version_Label:predict", {"instances": [1.0, 2.0]},
         {"predictions": [2.5, 3.0]}),
        ("/versions/123:predict", {"signature_name": "serving_default", "inputs": [3.0, 4.0]},
         {"outputs": [3.5, 4.0]}),
        (":regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]},
         {"results": [42.0]}),
        ("/versions/123:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]},
         {"results": [42.0]}),
        ("/labels/Version_Label:regress",
         {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]}, {"results": [42.0]}),
        (":classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 20.0}]},
         {"results": [[["", 12.0]]]}),
        ("/labels/Version_Label:classify",
         {"signature_name": "classify_x_to_y", "examples": [{"x": 10.0}]},
         {"results": [[["", 7.0]]]}),
        # the empty columnar batch (FillTensorMapFromInputsMap: a tensor of shape [0])
        (":predict", {"inputs": {"x": []}}, {"outputs": []}),
        # a scalar for an input of unknown rank (GetDenseTensorShape of a non-array: [])
        (":predict", {"signature_name": "predict_any_rank", "inputs": {"x": 5}},
         {"outputs": 4.5}),
        (":predict", {"signature_name": "predict_any_rank", "inputs": [[1, 2], [3, 4]]},
         {"outputs": [[2.5, 3.0], [3.5, 4.0]]}),
    ],
    ids=["predict rows", "predict columnar", "classify", "regress", "predict version",
         "predict label", "predict signature columnar", "regress 80", "regress version",
         "regress label", "classify 20", "classify label", "empty columnar batch",
         "scalar for unknown rank", "matrix for unknown rank"],
)  # fmt: skip
def test_half_plus_two_over_rest(half, path, body, want):
    """tensorflow_model_server_test.py's REST cases and HttpRestApiHandlerTest's, on the
    TF 2 half_plus_two (whose signatures all say ``tensorflow/serving/predict``)."""
    _, client = half
    status, doc = _post(client, HALF + path, body)
    assert (status, doc) == (200, want)


def test_a_float_beyond_float32_is_served_as_infinity(half):
    """FloatTensorThatExceedsMaxReturnsInf, end to end: 1e39 → inf → 0.5 * inf + 2."""
    _, client = half
    status, data = client.request("POST", HALF + ":predict", b'{"instances": [1e39, -1e39, 1e-46]}')
    assert (status, data) == (200, b'{"predictions":[Infinity,-Infinity,2.0]}')


def test_status_by_version_and_by_label(half):
    """HttpRestApiHandlerTest.GetStatus: every version, one version, and by version label.

    TF Serving's status reads ``model_spec.version`` only (get_model_status_impl.cc): a
    label, known or not, answers every version's status, as ``two`` shows.
    """
    _, client = half
    one = {
        "model_version_status": [
            {"version": "123", "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}
        ]
    }  # fmt: skip
    for path in ("", "/versions/123", "/labels/Version_Label"):
        status, data = client.request("GET", HALF + path)
        assert (status, json.loads(data)) == (200, one), path
    status, data = client.request("GET", "/v1/models/two/labels/stable")
    assert status == 200
    assert [e["version"] for e in json.loads(data)["model_version_status"]] == ["2", "1"]
    status, data = client.request("GET", "/v1/models/two/labels/whatever")
    assert status == 200 and len(json.loads(data)["model_version_status"]) == 2
    # metadata and predictions do resolve a label (ServerCore::GetModelVersionForLabel)
    status, data = client.request("GET", "/v1/models/two/labels/stable/metadata")
    assert json.loads(data)["model_spec"]["version"] == "1"
    status, data = client.request("GET", "/v1/models/two/labels/canary/metadata")
    assert json.loads(data)["model_spec"]["version"] == "2"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        (":predict", b"", 400, "malformed JSON"),
        (":predict", b"instances = [1, 2]", 400, "malformed JSON"),
        (":predict", b'{ "instances": ["x", "y"] }', 400, "expected float32 numbers, got strings"),
        ("/labels/Version_Nonexistent:predict", b'{ "instances": ["x", "y"] }', 400,
         "Unrecognized servable version label: Version_Nonexistent"),
        (":predict", b'{ "signature_name": 100 }', 400,
         "'signature_name' key must be a string value."),
        (":classify", b'{"examples": [{"x": 2.0}]}', 400,
         "No classification inputs found in SignatureDef: serving_default"),
        (":regress", b'{"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}', 400,
         "No regression outputs found in SignatureDef: classify_x_to_y"),
    ],
    ids=["empty", "not JSON", "strings for float", "unknown label", "signature not a string",
         "classify a predict signature", "regress a classify signature"],
)  # fmt: skip
def test_half_plus_two_request_errors(half, path, body, status, message):
    """HttpRestApiHandlerTest.PredictRequestErrors (TF Serving's codes; our own words where
    its come from rapidjson), and classifier.cc/regressor.cc's signature checks."""
    _, client = half
    got, data = client.request("POST", HALF + path, body)
    assert got == status and message in json.loads(data)["error"], data


def test_half_plus_two_classify_and_regress_over_grpc(half):
    """tensorflow_model_server_test.py testClassifyTf2 and testRegressTf2 (score 3.0 for x=2),
    and an unknown version label as INVALID_ARGUMENT (ServerCore::GetModelVersionForLabel)."""
    import grpc
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    srv, _ = half
    with grpc.insecure_channel(f"127.0.0.1:{srv.server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name = "half_plus_two"
        request.model_spec.signature_name = "classify_x_to_y"
        request.input.example_list.examples.add().features.feature["x"].float_list.value.extend(
            [2.0]
        )
        result = stub.Classify(request, timeout=30)
        assert len(result.result.classifications) == 1
        assert [c.score for c in result.result.classifications[0].classes] == [3.0]
        spec = result.model_spec
        assert (spec.name, spec.signature_name, spec.version.value) == (
            "half_plus_two",
            "classify_x_to_y",
            123,
        )
        reg = regression_pb2.RegressionRequest()
        reg.model_spec.name = "half_plus_two"
        reg.model_spec.signature_name = "regress_x_to_y"
        reg.input.example_list.examples.add().features.feature["x"].float_list.value.extend([2.0])
        result = stub.Regress(reg, timeout=30)
        assert [r.value for r in result.result.regressions] == [3.0]
        assert result.model_spec.signature_name == "regress_x_to_y"
        reg.model_spec.version_label = "Version_Nonexistent"
        with pytest.raises(grpc.RpcError) as err:
            stub.Regress(reg, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Unrecognized servable version label" in err.value.details()
        status = get_model_status_pb2.GetModelStatusRequest()
        status.model_spec.name = "two"
        status.model_spec.version_label = "stable"
        got = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status, timeout=30)
        assert [s.version for s in got.model_version_status] == [2, 1]
