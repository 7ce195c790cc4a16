from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainyard.serving import schema
from trainyard.serving.schema import (
    InvalidRequest,
    decode_predict_request,
    encode_predict_response,
    parse_feature_spec,
)

IMAGE = {"image": ("float32", (None, 8, 8, 1))}
TABLE = {"a": ("float32", (None,)), "n": ("int64", (None,))}
IMG = np.arange(64, dtype=np.float32).reshape(8, 8, 1) / 64


def _img(rows: int = 2) -> list:
    return [IMG.tolist()] * rows


GOOD = [
    ("rows bare values", IMAGE, {"instances": _img(3)}, {"image": (3, 8, 8, 1)}, False),
    ("rows named", IMAGE, {"instances": [{"image": IMG.tolist()}]}, {"image": (1, 8, 8, 1)}, False),
    ("columnar bare", IMAGE, {"inputs": _img(2)}, {"image": (2, 8, 8, 1)}, True),
    ("columnar named", IMAGE, {"inputs": {"image": _img(4)}}, {"image": (4, 8, 8, 1)}, True),
    (
        "table rows",
        TABLE,
        {"instances": [{"a": 1.5, "n": 2}, {"a": 0, "n": 3}]},
        {"a": (2,), "n": (2,)},
        False,
    ),
    ("table columnar", TABLE, {"inputs": {"a": [1, 2], "n": [3, 4]}}, {"a": (2,), "n": (2,)}, True),
    ("signature name", TABLE, {"signature_name": "serving_default", "inputs": {"a": [1], "n": [1]}},
     {"a": (1,), "n": (1,)}, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "doc", "shapes", "columnar"), [c[1:] for c in GOOD], ids=[c[0] for c in GOOD]
)
def test_decode_accepts(spec, doc, shapes, columnar):
    inputs, rows, col = decode_predict_request(json.dumps(doc).encode(), spec)
    assert col is columnar
    assert {k: v.shape for k, v in inputs.items()} == shapes
    assert rows == next(iter(shapes.values()))[0]
    for name, (dtype, _) in spec.items():
        assert inputs[name].dtype == np.dtype(dtype)


def test_decode_values_exact():
    inputs, _, _ = decode_predict_request(json.dumps({"instances": _img(2)}).encode(), IMAGE)
    np.testing.assert_array_equal(inputs["image"][1], IMG)


BAD = [
    ("malformed json", IMAGE, b'{"instances": [1,', "malformed JSON"),
    ("not utf8", IMAGE, b"\xff\xfe", "malformed JSON"),
    ("not an object", IMAGE, b"[1, 2]", "must be a JSON object"),
    ("neither format", IMAGE, b"{}", "exactly one of"),
    ("both formats", IMAGE, b'{"instances": [], "inputs": []}', "exactly one of"),
    ("bad signature", IMAGE, b'{"signature_name": "x", "inputs": [1]}',
     'Serving signature name: "x" not found in signature def'),
    ("empty instances", IMAGE, b'{"instances": []}', "non-empty list"),
    ("NaN for an integer", TABLE, b'{"inputs": {"a": [1], "n": [NaN]}}',
     "inputs.n: NaN is not of expected type int64"),
    ("row wrong shape", IMAGE, json.dumps({"instances": [IMG.tolist(), IMG[:, :, 0].tolist()]}),
     "instances[1].image: expected shape (8, 8, 1) per row, got (8, 8)"),
    ("all rows wrong shape", IMAGE, json.dumps({"instances": [IMG[:4].tolist()]}),
     "instances[0].image: expected shape (8, 8, 1) per row, got (4, 8, 1)"),
    ("strings", IMAGE, json.dumps({"instances": [[["x"] * 1] * 8] * 8}), "got strings"),
    ("null integer", TABLE, b'{"instances": [{"a": null, "n": null}]}',
     "instances.n: expected int64 values (no missing value), got null"),
    ("missing feature row", TABLE, b'{"instances": [{"a": 1, "n": 1}, {"a": 2}]}',
     "instances[1]: missing feature 'n'"),
    ("unknown feature row", TABLE, b'{"instances": [{"a": 1, "n": 1, "z": 0}]}',
     "instances[0]: unknown feature 'z'"),
    ("missing feature columnar", TABLE, b'{"inputs": {"a": [1]}}', "inputs: missing feature 'n'"),
    ("batch mismatch", TABLE, b'{"inputs": {"a": [1, 2], "n": [1]}}', "same batch size"),
    ("fractional int", TABLE, b'{"inputs": {"a": [1], "n": [1.5]}}',
     "inputs.n: 1.5 is not of expected type int64"),
    ("1.0 for an integer", TABLE, b'{"instances": [{"a": 1, "n": 1.0}]}',
     "instances.n: 1.0 is not of expected type int64"),
    ("exponent for an integer", TABLE, b'{"inputs": {"a": [1], "n": [1e2]}}',
     "inputs.n: 100.0 is not of expected type int64"),
    ("integer beyond int64", TABLE, b'{"inputs": {"a": [1], "n": [9223372036854775808]}}',
     "inputs.n: value out of range for int64"),
    ("booleans", TABLE, b'{"inputs": {"a": [true], "n": [1]}}',
     "inputs.a: expected float32 numbers, got booleans"),
    ("bare rows multi input", TABLE, b'{"instances": [1, 2]}', "expected an object with features"),
    ("mixed rows", TABLE, b'{"instances": [{"a": 1, "n": 1}, 3]}',
     "instances[1]: expected an object"),
    ("scalar for a batched input", TABLE, b'{"inputs": {"a": 1, "n": [1]}}',
     "inputs.a: expected shape (?,), got ()"),
    ("ragged row", TABLE, b'{"inputs": {"a": [1, [2, 3]], "n": [1, 2]}}',
     "row 1 of inputs.a: expected shape () per row, got (2,)"),
    ("nested scalar feature", TABLE, b'{"inputs": {"a": [[1]], "n": [1]}}',
     "row 0 of inputs.a: expected shape () per row, got (1,)"),
    ("too many rows", TABLE, json.dumps({"inputs": {"a": [1] * 11, "n": [1] * 11}}), "at most 10"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "body", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_decode_rejects_with_clear_message(spec, body, message):
    raw = body.encode() if isinstance(body, str) else body
    with pytest.raises(InvalidRequest) as exc:
        decode_predict_request(raw, spec, max_rows=10)
    assert message in str(exc.value)


def test_encode_shapes_match_tf_serving():
    outputs = {
        "probabilities": np.array([[0.25, 0.75], [1.0, 0.0]], np.float32),
        "class_id": np.array([1, 0], np.int64),
    }
    rows = json.loads(encode_predict_response(outputs, columnar=False))
    assert rows == {
        "predictions": [
            {"class_id": 1, "probabilities": [0.25, 0.75]},
            {"class_id": 0, "probabilities": [1.0, 0.0]},
        ]
    }
    cols = json.loads(encode_predict_response(outputs, columnar=True))
    assert cols == {"outputs": {"class_id": [1, 0], "probabilities": [[0.25, 0.75], [1.0, 0.0]]}}
    single = json.loads(encode_predict_response({"y": np.array([3, 4])}, columnar=False))
    assert single == {"predictions": [3, 4]}
    assert json.loads(encode_predict_response({"y": np.array([3])}, columnar=True)) == {
        "outputs": [3]
    }


ENCODE = [
    ("float32 3-d", {"y": np.random.default_rng(2).normal(size=(3, 2, 4)).astype(np.float32)}),
    ("float64", {"y": np.array([0.1, 1e-300, -2.5])}),
    ("int64 and float32", {"c": np.array([1, 2]), "p": np.array([[0.5, 0.5], [1, 0]], np.float32)}),
    ("bool", {"y": np.array([True, False])}),
    ("empty rows", {"y": np.zeros((2, 0), np.float32)}),
    ("non-finite falls back", {"y": np.array([np.nan, np.inf, 1.0], np.float32)}),
]  # fmt: skip


@pytest.mark.parametrize("columnar", [True, False], ids=["columnar", "rows"])
@pytest.mark.parametrize("outputs", [c[1] for c in ENCODE], ids=[c[0] for c in ENCODE])
def test_encode_round_trips_values(outputs, columnar):
    doc = json.loads(encode_predict_response(outputs, columnar))
    names = sorted(outputs)
    if columnar:
        got = doc["outputs"] if len(names) > 1 else {names[0]: doc["outputs"]}
    elif len(names) == 1:
        got = {names[0]: doc["predictions"]}
    else:
        got = {n: [row[n] for row in doc["predictions"]] for n in names}
    for n in names:
        want = outputs[n]
        have = np.asarray(
            [[float(v) for v in r] if isinstance(r, list) else float(r) for r in got[n]]
            if want.dtype.kind == "f" and want.ndim == 1
            else got[n],
            dtype=want.dtype,
        ).reshape(want.shape)
        np.testing.assert_array_equal(have, want)


SPECS_BAD = [
    ("not a mapping", [1], "non-empty mapping"),
    ("entry not pair", {"x": "float32"}, "expected [dtype, shape]"),
    ("bad dtype", {"x": ["complex64", [None]]}, "unsupported dtype"),
    ("no batch dim", {"x": ["float32", [8]]}, "batch dimension"),
    ("negative dim", {"x": ["float32", [None, -3]]}, "batch dimension"),
]


@pytest.mark.parametrize(
    ("raw", "message"), [c[1:] for c in SPECS_BAD], ids=[c[0] for c in SPECS_BAD]
)
def test_parse_feature_spec_rejects(raw, message):
    with pytest.raises(ValueError, match=r"spec\.json") as exc:
        parse_feature_spec(raw, "spec.json")
    assert message in str(exc.value)


def test_parse_feature_spec_round_trip():
    spec = parse_feature_spec({"image": ["float32", [None, 8, 8, 1]]}, "x")
    assert spec == {"image": ("float32", (None, 8, 8, 1))}


SOME_IMAGES = np.random.default_rng(1).normal(size=(3, 8, 8, 1)).astype(np.float32)


SCALAR = {"x": ("float32", (None,))}
PAIR = {"x": ("float32", (None, 1))}
MALFORMED = [
    ("space inside a number list", SCALAR, b'{"inputs": [1 2]}', "malformed JSON"),
    ("empty slot", SCALAR, b'{"inputs": [1,,2]}', "malformed JSON"),
    ("trailing comma", SCALAR, b'{"inputs": [1,2,]}', "malformed JSON"),
    ("newline between numbers", SCALAR, b'{"inputs": [1\n2]}', "malformed JSON"),
    ("double dot", SCALAR, b'{"inputs": [1.2.3]}', "malformed JSON"),
    ("number before a list", PAIR, b'{"inputs": [[1],5[2]]}', "malformed JSON"),
    ("number after a list", PAIR, b'{"inputs": [[1]5,[2]]}', "malformed JSON"),
    ("bracket inside a number", PAIR, b'{"inputs": [[1],[2[]]]}', "malformed JSON"),
    ("short row", IMAGE, json.dumps({"instances": [IMG.tolist(), IMG[:7].tolist()]}).encode(),
     "instances[1].image: expected shape (8, 8, 1) per row, got (7, 8, 1)"),
    ("wrong feature name", IMAGE, json.dumps({"inputs": {"img": [IMG.tolist()]}}).encode(),
     "inputs: missing feature 'image'"),
    ("null inside an integer input", {"x": ("int64", (None,))}, b'{"inputs": [1, null]}',
     "inputs.x: expected int64 values (no missing value), got null and numbers"),
    ("quoted number", SCALAR, b'{"inputs": [1, "2"]}', "got strings"),
    ("boolean among numbers", SCALAR, b'{"inputs": [1, true]}', "got booleans"),
    ("letters", SCALAR, b'{"inputs": [1, nan]}', "malformed JSON"),
    ("empty instances", SCALAR, b'{"instances": []}', "'instances' must be a non-empty list"),
    ("too many rows", SCALAR, b'{"inputs": [1,2,3,4,5,6,7,8,9,10,11]}', "at most 10"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "body", "message"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_number_lists_get_one_clear_error(spec, body, message):
    with pytest.raises(InvalidRequest) as exc:
        decode_predict_request(body, spec, max_rows=10)
    assert message in str(exc.value)


# Layouts and spellings clients send: decoded to the values JSON gives (dtype, sign of 0).
COMPACT = (",", ":")
F64 = {"x": ("float64", (None, 3))}
F16 = {"x": ("float16", (None, 2))}
EXACT = [
    ("rows compact", IMAGE, json.dumps({"instances": SOME_IMAGES.tolist()}, separators=COMPACT)),
    ("rows spaced", IMAGE, json.dumps({"instances": SOME_IMAGES.tolist()})),
    ("columnar indented", IMAGE, json.dumps({"inputs": {"image": SOME_IMAGES.tolist()}}, indent=2)),
    ("columnar bare", IMAGE, json.dumps({"inputs": SOME_IMAGES.tolist()})),
    ("exponents and ints", IMAGE, json.dumps({"instances": (SOME_IMAGES * 1e-7).tolist()})
     .replace("0.0", "0")),
    ("negative and exponents", IMAGE, json.dumps({"instances": (SOME_IMAGES - 0.5).tolist()})),
    ("tiny, capital E", IMAGE, json.dumps({"instances": (SOME_IMAGES * 1e-30).tolist()})
     .replace("e-", "E-")),
    ("integer -0 is +0, float -0.0 stays", SCALAR, '{"inputs": [-0, -0.0, 0, 3, -2.5]}'),
    ("scalar rows compact", SCALAR,
     json.dumps({"instances": list(range(-3, 40))}, separators=COMPACT)),
    ("float64 feature", F64, json.dumps({"inputs": {"x": [[0.1, 1e15, -7]] * 9}})),
    ("float16 feature", F16, json.dumps({"instances": [[0.1, 65504]] * 9})),
    ("one value", PAIR, '{"instances": [[1.5]]}'),
    ("newline after a comma", SCALAR, '{"inputs": [1,\n2, 3]}'),
    ("space before a comma", SCALAR, '{"inputs": [1 , 2]}'),
    ("spaces inside brackets", PAIR, '{"inputs": [ [1] , [ 2 ] ]}'),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "body"), [c[1:] for c in EXACT], ids=[c[0] for c in EXACT])
def test_number_layouts_decode_as_json_reads_them(spec, body):
    raw = body.encode()
    ((name, (dtype, _)),) = spec.items()
    doc = json.loads(raw)
    values = doc.get("instances", doc.get("inputs"))
    want = np.asarray(values[name] if isinstance(values, dict) else values).astype(dtype)
    inputs, rows, columnar = decode_predict_request(raw, spec, max_rows=10**6)
    got = inputs[name]
    assert (rows, columnar) == (len(want), b'"inputs"' in raw)
    assert got.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


# Numbers float64 cannot hold exactly: read as JSON reads them, then rounded once.
INEXACT = [
    ("integer beyond 2**53", SCALAR, '{"inputs": [9007199254740993, 1]}'),
    ("beyond 2**53 as a float", SCALAR, '{"inputs": [1e20, 1]}'),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "body"), [c[1:] for c in INEXACT], ids=[c[0] for c in INEXACT])
def test_inexact_numbers_are_read_as_json_reads_them(spec, body):
    raw = body.encode()
    want = np.asarray(json.loads(raw)["inputs"]).astype(np.float32)
    got = decode_predict_request(raw, spec)[0]["x"]
    np.testing.assert_array_equal(got, want)


# What a lenient number parser would take but JSON does not, and structures with the right
# number of values and brackets in the wrong places: one 400 that says what is wrong.
NOT_JSON = [
    ("leading dot", SCALAR, b'{"inputs": [.5, 1]}', "malformed JSON"),
    ("trailing dot", SCALAR, b'{"inputs": [5., 1]}', "malformed JSON"),
    ("plus sign", SCALAR, b'{"inputs": [+5, 1]}', "malformed JSON"),
    ("leading zero", SCALAR, b'{"inputs": [05, 1]}', "malformed JSON"),
    ("negative leading zero", SCALAR, b'{"inputs": [-05, 1]}', "malformed JSON"),
    ("dot before exponent", SCALAR, b'{"inputs": [5.e1, 1]}', "malformed JSON"),
    ("minus dot", SCALAR, b'{"inputs": [-.5, 1]}', "malformed JSON"),
    ("lone minus", SCALAR, b'{"inputs": [-, 1]}', "malformed JSON"),
    ("exponent without digits", SCALAR, b'{"inputs": [1e, 1]}', "malformed JSON"),
    ("inf", SCALAR, b'{"inputs": [inf, 1]}', "malformed JSON"),
    ("overflow to inf", SCALAR, b'{"inputs": [1, 1e400]}', "number 1e400 out of range"),
    ("brackets swapped across a comma", PAIR, b'{"inputs": [[1],[2[,]3],[4]]}', "malformed JSON"),
    ("digit where a bracket goes", PAIR, b'{"inputs": [[1],[2]7[3],[4]]}', "malformed JSON"),
    ("space where a bracket goes", PAIR, b'{"inputs": [[1], [2], 3], [4]]}', "malformed JSON"),
    ("rows one level too deep", PAIR, b'{"inputs": [[[1]], [[2]]]}',
     "row 0 of inputs.x: expected shape (1,) per row, got (1, 1)"),
    ("rows one level too shallow", {"x": ("float32", (None, 1, 1))}, b'{"inputs": [[1], [2]]}',
     "row 0 of inputs.x: expected shape (1, 1) per row, got (1,)"),
    ("values regrouped", {"x": ("float32", (None, 2))}, b'{"instances": [[1, 2, 3], [4]]}',
     "instances[0].x: expected shape (2,) per row, got (3,)"),
    ("string among numbers", SCALAR, b'{"inputs": [1, "2", 3]}', "got strings"),
    ("null among integers", {"x": ("int32", (None, 1))}, b'{"inputs": [[1], [null], [3]]}',
     "expected int32 values (no missing value)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "body", "message"), [c[1:] for c in NOT_JSON], ids=[c[0] for c in NOT_JSON]
)
def test_what_json_refuses_is_refused(spec, body, message):
    with pytest.raises(InvalidRequest) as exc:
        decode_predict_request(body, spec)
    assert message in str(exc.value)


def test_the_row_limit_applies_to_both_formats():
    body = json.dumps({"instances": np.zeros((300, 8, 8, 1)).tolist()}).encode()
    inputs, rows, columnar = decode_predict_request(body, IMAGE)
    assert (rows, columnar, inputs["image"].shape) == (300, False, (300, 8, 8, 1))
    with pytest.raises(InvalidRequest, match="request has 300 rows, at most 256 are allowed"):
        decode_predict_request(body, IMAGE, max_rows=256)
    body = json.dumps({"inputs": np.zeros((300, 8, 8, 1)).tolist()}).encode()
    with pytest.raises(InvalidRequest, match=r"inputs\.image: 300 rows, at most 256 are allowed"):
        decode_predict_request(body, IMAGE, max_rows=256)


def test_encode_prints_floats_as_tf_serving_and_escapes_names():
    outputs = {
        "p": np.array([[0.1, 1e-5], [3.4e38, -0.0]], np.float32)[:, ::-1],  # not contiguous
        'we"ird': np.array([True, False]),
        "k": np.array([[[1], [2]], [[3], [4]]], np.int8),
    }
    assert encode_predict_response(outputs, columnar=False) == (
        b'{"predictions":[{"k":[[1],[2]],"p":[1e-05,0.1],"we\\"ird":true},'
        b'{"k":[[3],[4]],"p":[-0.0,3.4e+38],"we\\"ird":false}]}'
    )
    assert json.loads(encode_predict_response(outputs, columnar=True))["outputs"]["p"] == [
        [1e-05, 0.1],
        [-0.0, 3.4e38],
    ]


# As TF Serving (api_rest.md; json_tensor.cc parses with rapidjson's kParseNanAndInfFlag and
# writes with kWriteNanAndInfFlag): NaN and Infinity are accepted in requests and written
# back as such, other top-level keys and inputs the signature does not take are ignored.
ACCEPTED = [
    ("NaN", SCALAR, b'{"inputs": [NaN, 1]}', [np.nan, 1.0]),
    ("Infinity", SCALAR, b'{"inputs": [Infinity, -Infinity]}', [np.inf, -np.inf]),
    ("unknown top-level key", SCALAR, b'{"inputs": [1, 2], "x": {"y": 2}}', [1.0, 2.0]),
    ("unknown columnar input", SCALAR, b'{"inputs": {"x": [3], "extra": ["z"]}}', [3.0]),
    ("long body with an extra key", SCALAR,
     json.dumps({"inputs": list(range(600)), "meta": 1}).encode(), list(range(600))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "body", "want"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
def test_decode_accepts_what_tf_serving_accepts(spec, body, want):
    inputs, rows, _ = decode_predict_request(body, spec, max_rows=1000)
    np.testing.assert_array_equal(inputs["x"], np.array(want, np.float32))
    assert rows == len(want)


def test_non_finite_outputs_are_written_as_tf_serving_writes_them():
    out = {"p": np.array([[0.1, np.nan], [np.inf, -np.inf]], np.float32)}
    assert encode_predict_response(out, True) == b'{"outputs":[[0.1,NaN],[Infinity,-Infinity]]}'
    # the other floats keep their own text (TF Serving's %g, not 17 digits)
    assert encode_predict_response(out, False) == (
        b'{"predictions":[[0.1,NaN],[Infinity,-Infinity]]}'
    )
    two = {"c": np.array([1, 2]), "p": out["p"]}
    assert encode_predict_response(two, False) == (
        b'{"predictions":[{"c":1,"p":[0.1,NaN]},{"c":2,"p":[Infinity,-Infinity]}]}'
    )


# Hostile numbers (issue 16's findings): decoded as JSON reads them.
HOSTILE_NUMBERS = [
    ("100,000-digit mantissa, 7-digit negative exponent", b"1" + b"0" * 100000 + b"e-1000000"),
    ("7-digit negative exponent", b"1e-1000000"),
    ("exponent with leading zeros", b"2e0000000000001"),
    ("long fraction", b"0." + b"3" * 5000),
]  # fmt: skip


@pytest.mark.parametrize(
    "number", [c[1] for c in HOSTILE_NUMBERS], ids=[c[0] for c in HOSTILE_NUMBERS]
)
def test_hostile_numbers_decode_as_json_does(number):
    body = b'{"inputs": [' + number + b", " + b"1," * 300 + b"1]}"
    got = decode_predict_request(body, SCALAR)[0]["x"]
    want = np.asarray(json.loads(body)["inputs"], np.float64).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_a_feature_key_that_is_not_utf8_is_a_400():
    body = b'{"inputs": {"\xac\xff": [' + b"1," * 300 + b"1]}}"
    with pytest.raises(InvalidRequest, match="malformed JSON"):
        decode_predict_request(body, SCALAR)


def test_integers_beyond_64_bits_are_numbers_not_ragged_lists():
    # JSON allows them; found by a new user sending 18446744073709551616 (2**64)
    body = b'{"inputs": [18446744073709551616, 99999999999999999999, 1]}'
    got = decode_predict_request(body, SCALAR)[0]["x"]
    np.testing.assert_array_equal(got, np.array([2.0**64, 1e20, 1.0], np.float32))
    with pytest.raises(InvalidRequest, match="out of range for int64"):
        decode_predict_request(b'{"inputs": {"a": [1], "n": [18446744073709551616]}}', TABLE)


def _tf_float_text(value: float, float32: bool) -> str:
    """json_tensor.cc WriteDecimal for one value, written out as its definition reads."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = f"{value:g}"
    back = float(np.float32(float(text))) if float32 else float(text)
    if back != value:
        text = f"{value:.9g}" if float32 else f"{value:.17g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def test_float_text_is_tf_servings():
    """JsontensorTest.FromJsonSingleFloatTensorSixDigitPrecision and ...NonFinite.

    json_tensor.cc WriteDecimal: %g when it reads back, else %.9g (float32) / %.17g
    (float64), ".0" on whole numbers; the writer agrees with the definition on every
    float32 class (normal, subnormal, huge, powers of two and ten) and on float64.
    """
    six = np.array([[9000000, 999999, 0.5], [0.0003, 0.00003, 555557.5]], np.float32)
    assert schema.dump_array(six) == b"[[9e+06,999999.0,0.5],[0.0003,3e-05,555557.5]]"
    odd = np.array([[np.nan, np.inf], [3, -np.inf]], np.float32)
    assert schema.dump_array(odd) == b"[[NaN,Infinity],[3.0,-Infinity]]"
    assert schema.dump_array(np.array([0.04786462], np.float32)) == b"[0.0478646196]"
    assert schema.dump_array(np.array([1 / 3, 0.1])) == b"[0.33333333333333331,0.1]"
    assert schema.dump_array(np.zeros((2, 0), np.float32)) == b"[[],[]]"
    rng = np.random.default_rng(16)
    values = np.concatenate(
        [
            rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            rng.random(20000, dtype=np.float32),
            (rng.standard_normal(20000) * 1e4).astype(np.float32),
            np.float32(2.0) ** np.arange(-149, 128).astype(np.float32),
            (np.float32(10.0) ** np.arange(-45, 39).astype(np.float32)),
            np.arange(-3000, 3000, dtype=np.float32) / np.float32(8),
        ]
    )
    got = schema.dump_array(values)[1:-1].decode().split(",")
    assert got == [_tf_float_text(float(v), True) for v in values]
    wide = rng.standard_normal(5000) * 10.0 ** rng.integers(-300, 300, 5000)
    got = schema.dump_array(wide)[1:-1].decode().split(",")
    assert got == [_tf_float_text(float(v), False) for v in wide]
