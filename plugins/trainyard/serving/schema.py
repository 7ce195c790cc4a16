"""Predict requests checked against a model's feature schema (TF Serving's REST formats).

A feature spec maps each serving input to ``(dtype, shape)`` with the batch dimension
first (``None``), exactly as ``trainyard.contracts.feature_spec`` returns it. Requests come
in TF Serving's row format (``{"instances": [...]}``) or columnar format
(``{"inputs": ...}``); both are decoded straight into numpy arrays and every mistake is
reported as one :class:`InvalidRequest` naming the row and the field. One parser (``json``)
and one writer (:func:`encode_predict_response`); numpy, no TensorFlow import.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import orjson

from trainyard.errors import TrainyardError

FeatureSpec = dict[str, tuple[str, tuple[int | None, ...] | None]]
"""Input name → (dtype, shape), batch first; shape None: a signature input of unknown rank."""

NUMERIC_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
SUPPORTED_DTYPES = (*NUMERIC_DTYPES, "bool", "string")
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# TF Serving writes a DT_STRING output whose name ends so as {"b64": ...} (json_tensor.cc)
BYTES_SUFFIX = "_bytes"
SIGNATURE_NAME_ERROR = "'signature_name' key must be a string value."
# numpy's most dimensions (TensorFlow allows 254: a deeper input is refused by name)
MAX_RANK = 64

_TF_DTYPE_NAMES = {
    "float16": "DT_HALF",
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "bool": "DT_BOOL",
    "string": "DT_STRING",
}


class InvalidRequest(TrainyardError):
    """A predict request does not match the model's feature schema (HTTP 400)."""


def model_error(e: BaseException) -> str:
    """What TensorFlow said about a failed call, without the Python stack it appends.

    An op's error carries, after ``Detected at node``, where the node was defined (file
    paths of this server); TF Serving answers with the op's message alone.
    """
    kept: list[str] = []
    in_stack = False
    for line in str(e).splitlines():
        if line.startswith("Detected at node"):
            in_stack = True
            continue
        if in_stack and (not line.strip() or line.startswith("  ")):
            continue  # the frames ("  File ...", their code lines) and blank lines
        in_stack = False
        if line.strip():
            kept.append(line.strip())
    text = " ".join(kept)
    return f"{type(e).__name__}: {text}"


def tf_dtype_name(dtype: str) -> str:
    """TF Serving's name of a dtype (``float32`` → ``DT_FLOAT``) for model metadata."""
    return _TF_DTYPE_NAMES.get(dtype, "DT_INVALID")


def parse_feature_spec(raw: Any, where: str) -> FeatureSpec:
    """Validate a feature spec read from JSON (``{name: [dtype, shape]}``).

    Args:
        raw: The decoded JSON value.
        where: What the value came from (a file path), used in error messages.

    Returns:
        The spec with tuple shapes, batch dimension ``None``.

    Raises:
        ValueError: If the value is not a valid spec (names ``where`` and the feature).
    """
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(
            f"{where}: feature_spec must be a non-empty mapping name -> [dtype, shape]"
        )
    spec: FeatureSpec = {}
    for name, entry in raw.items():
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise ValueError(f"{where}: feature {name!r}: expected [dtype, shape], got {entry!r}")
        dtype, shape = entry
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"{where}: feature {name!r}: unsupported dtype {dtype!r} "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
        if (
            not isinstance(shape, list | tuple)
            or not shape
            or shape[0] not in (None, -1)
            or not all(d is None or (isinstance(d, int) and d >= 0) for d in shape[1:])
        ):
            raise ValueError(
                f"{where}: feature {name!r}: shape must start with the batch dimension "
                f"null and list sizes or null, got {shape!r}"
            )
        spec[str(name)] = (str(dtype), (None, *shape[1:]))
    return spec


def spec_to_json(spec: FeatureSpec) -> dict[str, list[Any]]:
    """The JSON form of a feature spec (inverse of :func:`parse_feature_spec`)."""
    return {n: [dt, None if shape is None else list(shape)] for n, (dt, shape) in spec.items()}


def _finite_float(text: str) -> float:
    """A JSON number; one beyond double range (``1e400``) is refused, as rapidjson does."""
    value = float(text)
    if math.isinf(value):
        raise InvalidRequest(f"number {text[:32]} out of range (too big to be stored in double)")
    return value


def _nonfinite_constant(name: str) -> float:
    """``NaN``, ``Infinity``, ``-Infinity``: accepted, as TF Serving's parser does."""
    return float(name)


def _fmt_shape(shape: tuple[int | None, ...]) -> str:
    return (
        "("
        + ", ".join("?" if d is None else str(d) for d in shape)
        + ("," if len(shape) == 1 else "")
        + ")"
    )


def _depth(value: Any) -> int:
    """How deep the first elements of nested lists go (TF Serving's GetDenseTensorShape)."""
    depth = 0
    while isinstance(value, list):
        depth += 1
        if not value:
            break
        value = value[0]
    return depth


def _to_array(
    values: Any,
    dtype: str,
    shape: tuple[int | None, ...] | None,
    field: str,
    row_prefix: str,
    bools: bool = True,
) -> np.ndarray:
    """One input's JSON value (a number, string or nested lists) as an array, checked.

    The rules are TF Serving's (``json_tensor.cc``, ``AddValueToTensor``): a float input
    takes any JSON number (one beyond its range becomes ``±inf``); an integer input takes
    JSON integers only (``1.0`` and ``1e2`` are refused) within its range; a boolean input
    takes ``true``/``false``; a string input takes strings and ``{"b64": ...}`` objects.
    One difference: ``null`` is a missing value, NaN in a float input and ``""`` in a
    string input (a model with its preprocessing inside reads both as missing); an integer
    or boolean input has no missing value and refuses it.
    Lists must be regular; the shape must fit the signature's (any shape for an input of
    unknown rank). Errors name the input and, where one row is at fault, the row.

    Args:
        values: The decoded JSON value.
        dtype: The input's dtype.
        shape: The signature's shape (batch first), None for unknown rank.
        field: The input's name in messages (``instances.x``, ``inputs.x``).
        row_prefix: How one row's value is named in messages (``instances[{i}].x``,
            ``row {i} of inputs.x``).
        bools: Whether the body may hold ``true``/``false`` at all (False: skip that check).
    """
    depth = _depth(values)
    if depth > MAX_RANK:
        raise InvalidRequest(f"{field}: {depth} levels of nested lists, at most {MAX_RANK}")
    if dtype == "string":
        return _to_bytes_array(values, shape, field, row_prefix)
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError):
        _diagnose_rows(values, shape, row_prefix)
        raise InvalidRequest(f"{field}: ragged nested lists") from None
    if arr.size == 0:  # [] or [[], []]: no value to check, a dtype to give
        _check_shape(arr, shape, field, values, row_prefix)
        return np.zeros(arr.shape, dtype=dtype)
    kind = arr.dtype.kind
    flat: list[Any] = []
    if kind == "O":
        flat = _flat_items(values)
        if dtype in _FLOAT_DTYPES and all(type(v) in _NUMBER_OR_NULL for v in flat):
            # null is a missing number (NaN); integers beyond 64 bits read as floats
            try:
                arr, kind = np.asarray(values, dtype=np.float64), "f"
            except OverflowError:
                raise InvalidRequest(f"{field}: value out of range for {dtype}") from None
            except ValueError:
                _diagnose_rows(values, shape, row_prefix)
                raise InvalidRequest(f"{field}: ragged nested lists") from None
        elif any(v is None for v in flat):
            what = "a missing number is null" if dtype in _FLOAT_DTYPES else "no missing value"
            raise InvalidRequest(f"{field}: expected {dtype} values ({what}), got {_mixed(flat)}")
        elif any(isinstance(v, dict) for v in flat):
            raise InvalidRequest(f"{field}: expected {dtype} numbers, got an object")
        elif not all(type(v) in (int, float) for v in flat):
            _diagnose_rows(values, shape, row_prefix)
            raise InvalidRequest(f"{field}: ragged nested lists or mixed types (expected {dtype})")
        elif all(type(v) is int for v in flat):
            raise InvalidRequest(f"{field}: value out of range for {dtype}")
        else:
            kind = "f"
    if kind in "US":
        raise InvalidRequest(f"{field}: expected {dtype} numbers, got strings")
    _check_shape(arr, shape, field, values, row_prefix)
    if dtype == "bool":
        if kind != "b":
            raise InvalidRequest(f"{field}: expected booleans (true/false), got numbers")
        return arr
    if kind == "b" or (bools and any(type(v) is bool for v in flat or _flat_items(values))):
        raise InvalidRequest(f"{field}: expected {dtype} numbers, got booleans")
    if dtype.startswith("float"):
        with np.errstate(over="ignore"):  # beyond the dtype's range: inf, as TF Serving
            return arr.astype(dtype)
    if kind == "f":
        first = next(v for v in flat or _flat_items(values) if type(v) is float)
        text = "NaN" if first != first else repr(first).replace("inf", "Infinity")
        raise InvalidRequest(
            f"{field}: {text} is not of expected type {dtype} (an integer input takes "
            "integers written without a fraction or an exponent)"
        )
    info = np.iinfo(np.dtype(dtype))
    if arr.min() < info.min or arr.max() > info.max:
        raise InvalidRequest(f"{field}: value out of range for {dtype}")
    return arr.astype(dtype)


def is_b64_object(value: Any) -> bool:
    """Whether a JSON value is TF Serving's binary form ``{"b64": "<base64>"}``."""
    return type(value) is dict and len(value) == 1 and type(value.get("b64")) is str


def decode_b64(text: str, where: str) -> bytes:
    """Decode standard base64, padding optional (as absl::Base64Unescape); else one error."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}: unable to base64 decode {text[:32]!r}") from None


def _to_bytes_array(
    values: Any, shape: tuple[int | None, ...] | None, field: str, row_prefix: str
) -> np.ndarray:
    """Nested lists of strings / ``{"b64": ...}`` → an object array of bytes, regular."""
    dims: list[int] = []
    probe = values
    while isinstance(probe, list):
        dims.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat: list[bytes] = []
    stack: list[tuple[Any, int]] = [(values, 0)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, list):
            if level >= len(dims) or len(v) != dims[level]:
                _diagnose_rows(values, shape, row_prefix)
                raise InvalidRequest(f"{field}: ragged nested lists")
            stack.extend((item, level + 1) for item in reversed(v))
            continue
        if level != len(dims):
            raise InvalidRequest(f"{field}: ragged nested lists")
        if type(v) is str:
            flat.append(v.encode("utf-8", "surrogatepass"))
        elif is_b64_object(v):
            flat.append(decode_b64(v["b64"], field))
        elif v is None:
            flat.append(b"")  # missing: the empty string, as the model reads it
        else:
            raise InvalidRequest(
                f'{field}: expected strings or {{"b64": ...}} objects, got {type(v).__name__}'
            )
    arr = np.empty(len(flat), dtype=object)
    arr[:] = flat
    arr = arr.reshape(dims)
    _check_shape(arr, shape, field, values, row_prefix)
    return arr


_FLOAT_DTYPES = ("float16", "float32", "float64")
_NUMBER_OR_NULL = (int, float, type(None))


def _mixed(flat: list[Any]) -> str:
    """What a list of JSON values that should be one type holds (``null and strings``)."""
    names = {type(None): "null", str: "strings", bool: "booleans", dict: "objects"}
    kinds = sorted({names.get(type(v), "numbers") for v in flat})
    return " and ".join(kinds)


def _flat_items(values: Any) -> list[Any]:
    if not isinstance(values, list):
        return [values]
    out: list[Any] = []
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        else:
            out.append(v)
    return out


def _check_shape(
    arr: np.ndarray,
    shape: tuple[int | None, ...] | None,
    field: str,
    values: Any,
    row_prefix: str,
) -> None:
    """Check the array's shape against the signature's; name the first offending row."""
    if shape is None or (
        arr.ndim == len(shape)
        and all(e is None or e == g for e, g in zip(shape, arr.shape, strict=True))
    ):
        return
    _diagnose_rows(values, shape, row_prefix)
    raise InvalidRequest(
        f"{field}: expected shape {_fmt_shape(shape)}, got {_fmt_shape(arr.shape)}"
    )


def _diagnose_rows(values: Any, shape: tuple[int | None, ...] | None, row_prefix: str) -> None:
    """Raise for the first row whose shape is wrong or ragged (return if none is)."""
    if shape is None or not shape or not isinstance(values, list):
        return
    row_shape = shape[1:]
    for i, row in enumerate(values):
        try:
            r = np.asarray(row)
        except ValueError:
            raise InvalidRequest(f"{row_prefix.format(i=i)}: ragged nested lists") from None
        if r.dtype.kind == "O":
            raise InvalidRequest(f"{row_prefix.format(i=i)}: ragged nested lists")
        if r.ndim != len(row_shape) or any(
            e is not None and e != g for e, g in zip(row_shape, r.shape, strict=True)
        ):
            raise InvalidRequest(
                f"{row_prefix.format(i=i)}: expected shape {_fmt_shape(row_shape)} "
                f"per row, got {_fmt_shape(r.shape)}"
            )


class DecodedRequest(NamedTuple):
    """A decoded ``:predict`` request.

    Attributes:
        inputs: One array per input (batch first where the request gave one).
        rows: The batch size: the number of instances, or the first dimension of the
            first columnar input that has one (0 if none has).
        columnar: Whether the request used the columnar ``inputs`` format.
        signature: The ``signature_name`` it named (``""``: the default).
    """

    inputs: dict[str, np.ndarray]
    rows: int
    columnar: bool
    signature: str


def decode_request(
    body: bytes, specs: Callable[[str], FeatureSpec], max_rows: int = 65536
) -> DecodedRequest:
    """Decode and check a ``:predict`` request body against the signature it names.

    Args:
        body: The raw request body (UTF-8 JSON).
        specs: The input spec of a signature by name (``""``: the default signature);
            raises for a signature the model lacks.
        max_rows: The largest batch accepted in one request.

    Returns:
        The inputs, batch size, format and signature name.

    Raises:
        InvalidRequest: If the body is not JSON, uses neither or both formats, names a
            signature that is not a string, or an input is missing, of the wrong type or
            shape (names row and field).
    """
    doc = parse_json_object(body, "'instances' or 'inputs'")
    # other top-level keys are ignored, as TF Serving does
    signature = doc.get("signature_name", "")
    if type(signature) is not str:
        raise InvalidRequest(SIGNATURE_NAME_ERROR)
    spec = specs(signature)
    if ("instances" in doc) == ("inputs" in doc):
        raise InvalidRequest(
            "request must contain exactly one of 'instances' (row format) "
            "or 'inputs' (columnar format)"
        )
    bools = b"true" in body or b"false" in body  # without either, no value is a boolean
    if "instances" in doc:
        inputs = _decode_rows(doc["instances"], spec, max_rows, bools)
        rows = len(doc["instances"])
        return DecodedRequest(inputs, rows, False, signature)
    inputs = _decode_columns(doc["inputs"], spec, max_rows, bools)
    rows = next((a.shape[0] for a in inputs.values() if a.ndim), 0)
    return DecodedRequest(inputs, rows, True, signature)


def parse_json_object(body: bytes, expected: str) -> dict[str, Any]:
    """A request body as a JSON object, ``NaN``/``Infinity`` accepted, numbers in range.

    Args:
        body: The raw body.
        expected: What the object should hold, for the error message.

    Raises:
        InvalidRequest: If the body is not a JSON object, or is nested more deeply than
            the parser's recursion allows (about 1,000 levels).
    """
    try:
        doc = json.loads(body, parse_constant=_nonfinite_constant, parse_float=_finite_float)
    except InvalidRequest:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"malformed JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest(
            "JSON nested too deeply: this server reads up to about 1,000 levels"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"request body must be a JSON object with {expected}")
    return doc


def decode_predict_request(
    body: bytes, spec: FeatureSpec, max_rows: int = 65536
) -> tuple[dict[str, np.ndarray], int, bool]:
    """Decode and check a ``:predict`` request body for a model's default signature.

    Args:
        body: The raw request body (UTF-8 JSON).
        spec: The default signature's feature spec.
        max_rows: The largest batch accepted in one request.

    Returns:
        ``(inputs, rows, columnar)``: one array per feature, the batch size, and whether
        the request used the columnar ``inputs`` format.

    Raises:
        InvalidRequest: As :func:`decode_request`; also for any signature but the default.
    """

    def only_default(name: str) -> FeatureSpec:
        if name not in ("", DEFAULT_SIGNATURE):
            raise InvalidRequest(signature_not_found(name))
        return spec

    inputs, rows, columnar, _ = decode_request(body, only_default, max_rows)
    return inputs, rows, columnar


def signature_not_found(name: str) -> str:
    """TF Serving's REST message for a signature the model lacks (``GetInfoMap``)."""
    return f'Serving signature name: "{name or DEFAULT_SIGNATURE}" not found in signature def'


def _decode_rows(
    instances: Any, spec: FeatureSpec, max_rows: int, bools: bool
) -> dict[str, np.ndarray]:
    """The row format: each instance is one row (an object of inputs, or a bare value)."""
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("'instances' must be a non-empty list of rows")
    if len(instances) > max_rows:
        raise InvalidRequest(f"request has {len(instances)} rows, at most {max_rows} are allowed")
    names = list(spec)
    by_name = isinstance(instances[0], dict) and not is_b64_object(instances[0])
    if not by_name:
        if len(names) != 1:
            raise InvalidRequest(
                f"instances[0]: expected an object with features {names} (the model has "
                f"{len(names)} inputs)"
            )
        (name,) = names
        dtype, shape = spec[name]
        for i, row in enumerate(instances):
            if isinstance(row, dict) and not is_b64_object(row):
                raise InvalidRequest(f"instances[{i}]: mixes objects and bare values across rows")
        field, row = f"instances.{name}", f"instances[{{i}}].{name}"
        arr = _to_array(instances, dtype, shape, field, row, bools)
        return {name: arr}
    columns: dict[str, list[Any]] = {n: [] for n in names}
    wanted = set(names)
    for i, row in enumerate(instances):
        if not isinstance(row, dict) or is_b64_object(row):
            raise InvalidRequest(f"instances[{i}]: expected an object with features {names}")
        if "b64" in row and "b64" not in wanted:
            raise InvalidRequest(
                f'instances[{i}]: a {{"b64": ...}} object holds the key b64 alone, '
                "with a base64 string"
            )
        if row.keys() != wanted:
            missing = [n for n in names if n not in row]
            if missing:
                raise InvalidRequest(f"instances[{i}]: missing feature {missing[0]!r}")
            extra = sorted(k for k in row if k not in wanted)
            raise InvalidRequest(f"instances[{i}]: unknown feature {extra[0]!r} (expected {names})")
        for n in names:
            columns[n].append(row[n])
    out: dict[str, np.ndarray] = {}
    for name in names:
        dtype, shape = spec[name]
        field, row = f"instances.{name}", f"instances[{{i}}].{name}"
        out[name] = _to_array(columns[name], dtype, shape, field, row, bools)
    return out


def _decode_columns(
    inputs: Any, spec: FeatureSpec, max_rows: int, bools: bool
) -> dict[str, np.ndarray]:
    """The columnar format: each input's value is its whole tensor (any shape, scalars too).

    Inputs the signature does not take are ignored, as TF Serving does. Inputs whose
    signature shape starts with a batch dimension must agree on it (TF Serving leaves that
    to the model, whose error names no input).
    """
    names = list(spec)
    if not isinstance(inputs, dict) or is_b64_object(inputs):
        if len(names) != 1:
            raise InvalidRequest(f"'inputs' must be an object with features {names}")
        inputs = {names[0]: inputs}
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InvalidRequest(f"inputs: missing feature {missing[0]!r}")
    out: dict[str, np.ndarray] = {}
    batch: tuple[str, int] | None = None
    for name in names:
        dtype, shape = spec[name]
        field = f"inputs.{name}"
        arr = _to_array(inputs[name], dtype, shape, field, f"row {{i}} of {field}", bools)
        if arr.ndim and arr.shape[0] > max_rows:
            raise InvalidRequest(f"{field}: {arr.shape[0]} rows, at most {max_rows} are allowed")
        if shape and shape[0] is None and arr.ndim:
            if batch is not None and arr.shape[0] != batch[1]:
                raise InvalidRequest(
                    f"{field}: {arr.shape[0]} rows, but {batch[0]!r} has {batch[1]} "
                    "(every batched input needs the same batch size)"
                )
            batch = (name, arr.shape[0])
        out[name] = arr
    return out


def _float_tokens(flat: np.ndarray) -> list[str]:
    """Floats as TF Serving prints them (``json_tensor.cc``, ``WriteDecimal``).

    Six significant digits (printf ``%g``) when they read back as the same value, else
    ``%.9g`` (float32, and float16 widened as TF Serving does) or ``%.17g`` (float64);
    ``.0`` appended to a whole number printed without an exponent; ``NaN``, ``Infinity``,
    ``-Infinity``. So ``9e+06``, ``999999.0``, ``0.5``, ``3e-05`` and ``0.0478646196``.
    """
    float32 = flat.dtype.itemsize <= 4
    with np.errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one
        values = flat.astype(np.float64)
    texts = [f"{v:g}" for v in values.tolist()]
    back = np.array(texts, dtype=np.float64)
    if float32:
        back = back.astype(np.float32).astype(np.float64)
    finite = np.isfinite(values)
    wide = "{:.9g}" if float32 else "{:.17g}"
    for i in np.flatnonzero((back != values) & finite).tolist():
        texts[i] = wide.format(values[i])
    for i in np.flatnonzero(~finite).tolist():
        v = values[i]
        texts[i] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return [t if "." in t or "e" in t or t[-1] in "yN" else t + ".0" for t in texts]


def _tokens(arr: np.ndarray) -> list[str]:
    """Every value of a numeric or boolean array as JSON text, in C order."""
    flat = arr.reshape(-1)
    if arr.dtype.kind == "f":
        return _float_tokens(flat)
    if arr.dtype.kind == "b":
        return ["true" if v else "false" for v in flat.tolist()]
    return [str(v) for v in flat.tolist()]


def _nested(tokens: list[str], shape: tuple[int, ...]) -> str:
    """Flat JSON texts as nested JSON arrays of ``shape`` (C order; ``()``: the one value)."""
    if 0 in shape:
        text = "[]"
        for size in reversed(shape[: shape.index(0)]):
            text = "[" + ",".join([text] * size) + "]"
        return text
    parts = tokens
    for size in reversed(shape):
        parts = ["[" + ",".join(parts[i : i + size]) + "]" for i in range(0, len(parts), size)]
    return parts[0]


def dump_array(arr: np.ndarray) -> bytes:
    """One numeric or boolean array (any rank) as JSON text, floats as TF Serving prints them."""
    return _nested(_tokens(arr), arr.shape).encode()


def _string_value(v: Any, as_b64: bool) -> Any:
    if as_b64:
        raw = v if isinstance(v, bytes) else str(v).encode()
        return {"b64": base64.b64encode(raw).decode()}
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _values(arr: np.ndarray, as_b64: bool) -> list[Any]:
    """Each entry (batch row) of an output as a JSON value; a scalar output: one value."""
    if arr.dtype.kind in "SOU":
        flat = [_string_value(v, as_b64) for v in arr.reshape(-1).tolist()]
        if arr.ndim == 0:
            return flat
        nested = np.empty(arr.size, dtype=object)
        nested[:] = flat
        return nested.reshape(arr.shape).tolist()
    tokens = _tokens(arr)
    if arr.ndim == 0:
        return [orjson.Fragment(tokens[0])]
    per, row = len(tokens) // max(arr.shape[0], 1), arr.shape[1:]
    return [
        orjson.Fragment(_nested(tokens[i * per : (i + 1) * per], row)) for i in range(arr.shape[0])
    ]


def _whole(arr: np.ndarray, as_b64: bool) -> Any:
    """A whole output as one JSON value."""
    if arr.dtype.kind not in "SOU":
        return orjson.Fragment(dump_array(arr))
    values = _values(arr, as_b64)
    return values[0] if arr.ndim == 0 else values


def encode_predict_response(outputs: Mapping[str, np.ndarray], columnar: bool) -> bytes:
    """Encode model outputs in TF Serving's response shape.

    Args:
        outputs: Output name → array (batch first where batched).
        columnar: True for ``{"outputs": ...}``, False for ``{"predictions": [...]}``.

    Returns:
        The JSON body. With one output the value is bare; with several, the columnar form
        is an object and the row form is one object per row, as TF Serving does. Floats are
        printed as TF Serving prints them (:func:`dump_array`); string outputs whose name
        ends in ``_bytes`` are written as ``{"b64": ...}``, other strings as text.

    Raises:
        InvalidRequest: In the row format, for an output without a batch dimension or with
            another batch size than the others (TF Serving's messages).
    """
    names = sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    b64 = {n: n.endswith(BYTES_SUFFIX) for n in names}
    if columnar:
        values = {n: _whole(arrays[n], b64[n]) for n in names}
        payload: Any = {"outputs": values[names[0]] if len(names) == 1 else values}
    else:
        _check_row_outputs(arrays)
        if len(names) == 1:
            payload = {"predictions": _whole(arrays[names[0]], b64[names[0]])}
        else:
            rows = [_values(arrays[n], b64[n]) for n in names]
            payload = {
                "predictions": [dict(zip(names, r, strict=True)) for r in zip(*rows, strict=True)]
            }
    return orjson.dumps(payload)


def _check_row_outputs(arrays: Mapping[str, np.ndarray]) -> None:
    batch = -1
    for name, arr in arrays.items():
        if arr.ndim == 0:
            raise InvalidRequest(f"Tensor name: {name} has no shape information ")
        if batch >= 0 and arr.shape[0] != batch:
            raise InvalidRequest(
                f"Tensor name: {name} has inconsistent batch size: {arr.shape[0]} "
                f"expecting: {batch}"
            )
        batch = arr.shape[0]
