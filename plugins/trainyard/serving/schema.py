"""Predict requests checked against a model's feature schema (TF Serving's REST formats).

A feature spec maps each serving input to ``(dtype, shape)`` with the batch dimension
first (``None``), exactly as ``trainyard.contracts.feature_spec`` returns it. Requests come
in TF Serving's row format (``{"instances": [...]}``) or columnar format
(``{"inputs": ...}``); both are decoded straight into numpy arrays and every mistake is
reported as one :class:`InvalidRequest` naming the row and the field. Pure numpy: no
TensorFlow import.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainyard.errors import TrainyardError

FeatureSpec = dict[str, tuple[str, tuple[int | None, ...]]]

NUMERIC_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
SUPPORTED_DTYPES = (*NUMERIC_DTYPES, "bool")

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
    return {name: [dtype, list(shape)] for name, (dtype, shape) in spec.items()}


def _reject_constant(name: str) -> float:
    raise InvalidRequest(f"non-finite number {name} is not allowed in a request")


def _fmt_shape(shape: tuple[int | None, ...]) -> str:
    return (
        "("
        + ", ".join("?" if d is None else str(d) for d in shape)
        + ("," if len(shape) == 1 else "")
        + ")"
    )


def _to_array(
    values: Any,
    dtype: str,
    shape: tuple[int | None, ...],
    field: str,
    where: str,
    row_prefix: str,
) -> np.ndarray:
    """Convert nested lists to an array of ``dtype`` and ``shape``.

    Strings, nulls, booleans for numbers, fractions for integers and ragged lists are
    rejected; shape errors name the first offending row.
    """
    try:
        arr = np.asarray(values)
    except ValueError:
        _diagnose_rows(values, shape, field, row_prefix)
        raise InvalidRequest(f"{where}: ragged nested lists") from None
    kind = arr.dtype.kind
    if kind == "O":
        if any(v is None for v in _flat_items(values)):
            raise InvalidRequest(f"{where}: null values are not allowed (expected {dtype})")
        _diagnose_rows(values, shape, field, row_prefix)
        raise InvalidRequest(f"{where}: ragged nested lists or mixed types (expected {dtype})")
    if kind in "US":
        raise InvalidRequest(f"{where}: expected {dtype} numbers, got strings")
    _check_shape(arr, shape, field, values, row_prefix)
    if dtype == "bool":
        if kind != "b":
            raise InvalidRequest(f"{where}: expected booleans (true/false), got numbers")
        return arr
    if kind == "b" or any(type(v) is bool for v in _flat_items(values)):
        raise InvalidRequest(f"{where}: expected {dtype} numbers, got booleans")
    if (
        kind == "f"
        and dtype not in ("float16", "float32", "float64")
        and not np.all(arr == np.round(arr))
    ):
        raise InvalidRequest(f"{where}: expected integers ({dtype}), got fractional numbers")
    if np.issubdtype(np.dtype(dtype), np.integer) and arr.size:
        info = np.iinfo(np.dtype(dtype))
        if arr.min() < info.min or arr.max() > info.max:
            raise InvalidRequest(f"{where}: value out of range for {dtype}")
    return arr.astype(dtype, copy=False)


def _flat_items(values: Any) -> list[Any]:
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
    arr: np.ndarray, shape: tuple[int | None, ...], field: str, values: list[Any], row_prefix: str
) -> None:
    """Check the array's per-row shape; name the first offending row if it is wrong."""
    row_shape = shape[1:]
    got = arr.shape[1:]
    if len(got) == len(row_shape) and all(
        e is None or e == g for e, g in zip(row_shape, got, strict=True)
    ):
        return
    _diagnose_rows(values, shape, field, row_prefix)
    raise InvalidRequest(
        f"{field}: expected shape {_fmt_shape(shape)}, got {_fmt_shape(arr.shape)}"
    )


def _diagnose_rows(
    values: list[Any], shape: tuple[int | None, ...], field: str, row_prefix: str
) -> None:
    """Raise for the first row whose shape is wrong or ragged (return if none is)."""
    row_shape = shape[1:]
    for i, row in enumerate(values):
        try:
            r = np.asarray(row)
        except ValueError:
            raise InvalidRequest(f"{row_prefix.format(i=i)}{field}: ragged nested lists") from None
        if r.dtype.kind == "O":
            raise InvalidRequest(f"{row_prefix.format(i=i)}{field}: ragged nested lists")
        if r.ndim != len(row_shape) or any(
            e is not None and e != g for e, g in zip(row_shape, r.shape, strict=True)
        ):
            raise InvalidRequest(
                f"{row_prefix.format(i=i)}{field}: expected shape {_fmt_shape(row_shape)} "
                f"per row, got {_fmt_shape(r.shape)}"
            )


# Below these sizes the per-call overhead of Arrow exceeds what it saves over json.
FAST_DECODE_MIN_BYTES = 8192
ARROW_ENCODE_MIN_VALUES = 512

_NUMBER_CHARS = b"0123456789eE+-."
_FAST_HEAD = re.compile(rb'\s*\{\s*"(instances|inputs)"\s*:\s*(?:\{\s*"([^"\\]+)"\s*:\s*)?$')
_FAST_TAIL = re.compile(rb"\s*(\})?\s*\}\s*$")
_COMMA = ord(",")
_AROUND_NUMBER = " \t\r\n[],"


def _parse_numbers(array: bytes) -> np.ndarray | None:
    """Parse the numbers of a JSON array of numbers (any nesting) in Arrow's C++ kernels.

    The caller has checked that ``array`` holds only brackets, commas, whitespace and
    number characters in the expected bracket structure. Each comma ends one number, so
    the comma positions are the offsets of a zero-copy Arrow string array whose values are
    one number each with brackets and whitespace around it; those are trimmed and the
    strings cast to float64 (``fast_float``). A value with anything else inside (two
    numbers, an empty slot, a number outside the innermost lists) fails the cast and
    returns None.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(array) >= 2**31:
        return None
    ends = np.flatnonzero(np.frombuffer(array, np.uint8) == _COMMA)
    offsets = np.empty(ends.size + 2, np.int32)
    offsets[0] = 0
    offsets[1:-1] = ends + 1
    offsets[-1] = len(array)
    texts = pa.StringArray.from_buffers(ends.size + 1, pa.py_buffer(offsets), pa.py_buffer(array))
    try:
        numbers = pc.cast(pc.ascii_trim(texts, _AROUND_NUMBER), pa.float64())
    except (pa.ArrowInvalid, ValueError):
        return None
    return numbers.to_numpy(zero_copy_only=False)


def _skeleton(row_shape: tuple[int, ...]) -> bytes:
    if not row_shape:
        return b""
    inner = _skeleton(row_shape[1:])
    return b"[" + b",".join([inner] * row_shape[0]) + b"]"


def _fast_decode(body: bytes, spec: FeatureSpec) -> tuple[dict[str, np.ndarray], int, bool] | None:
    """Decode a single-feature float request without building Python lists.

    Applies to ``{"instances": ARRAY}``, ``{"inputs": ARRAY}`` and ``{"inputs": {"f":
    ARRAY}}`` where ARRAY is a regular nested list of plain numbers; numbers are parsed by
    numpy in C. The bracket structure is checked against the feature's fixed row shape by
    comparing the text with the numbers removed to the structure that shape must have.
    Anything else (or anything doubtful) returns None and takes the ``json`` path, which
    also produces the precise error messages.
    """
    if len(spec) != 1:
        return None
    ((name, (dtype, shape)),) = spec.items()
    row_shape = shape[1:]
    if dtype not in ("float16", "float32", "float64") or any(d is None for d in row_shape):
        return None
    start, end = body.find(b"["), body.rfind(b"]")
    if start < 0 or end < start:
        return None
    head = _FAST_HEAD.match(body, 0, start)
    tail = _FAST_TAIL.match(body, end + 1)
    if head is None or tail is None or (head[2] is None) != (tail[1] is None):
        return None
    columnar = head[1] == b"inputs"
    if head[2] is not None and (not columnar or head[2].decode() != name):
        return None
    array = body[start : end + 1]
    # With the number characters and whitespace removed, only the brackets and commas of
    # the expected structure may remain (this also rules out letters, quotes and nulls).
    skeleton = array.translate(None, _NUMBER_CHARS + b" \t\r\n")
    row_skel = _skeleton(row_shape)  # type: ignore[arg-type]
    rows, rem = divmod(len(skeleton) - 1, len(row_skel) + 1)
    if rem or rows < 1 or skeleton != b"[" + b",".join([row_skel] * rows) + b"]":
        return None
    flat = _parse_numbers(array)
    if flat is None:
        return None
    per_row = int(np.prod(row_shape, dtype=np.int64))
    if flat.size != rows * per_row or not np.all(np.isfinite(flat)):
        return None
    return {name: flat.astype(dtype).reshape((rows, *row_shape))}, rows, columnar


def decode_predict_request(
    body: bytes, spec: FeatureSpec, max_rows: int = 65536
) -> tuple[dict[str, np.ndarray], int, bool]:
    """Decode and check a ``:predict`` request body.

    Args:
        body: The raw request body (UTF-8 JSON).
        spec: The model's feature spec.
        max_rows: The largest batch accepted in one request.

    Returns:
        ``(inputs, rows, columnar)``: one array per feature (batch first), the batch size,
        and whether the request used the columnar ``inputs`` format.

    Raises:
        InvalidRequest: If the body is not JSON, uses neither or both formats, or a
            feature is missing, unknown, of the wrong type or shape (names row and field).
    """
    fast = _fast_decode(body, spec) if len(body) >= FAST_DECODE_MIN_BYTES else None
    if fast is not None:
        if fast[1] > max_rows:
            raise InvalidRequest(f"request has {fast[1]} rows, at most {max_rows} are allowed")
        return fast
    try:
        doc = json.loads(body, parse_constant=_reject_constant)
    except InvalidRequest:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"malformed JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest("malformed JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object with 'instances' or 'inputs'")
    unknown = sorted(set(doc) - {"instances", "inputs", "signature_name"})
    if unknown:
        raise InvalidRequest(
            f"unknown request field {unknown[0]!r} (expected 'instances' or 'inputs')"
        )
    sig = doc.get("signature_name", "serving_default")
    if sig not in ("serving_default", ""):
        raise InvalidRequest(f"unknown signature_name {sig!r} (this model has 'serving_default')")
    if ("instances" in doc) == ("inputs" in doc):
        raise InvalidRequest(
            "request must contain exactly one of 'instances' (row format) "
            "or 'inputs' (columnar format)"
        )
    if "instances" in doc:
        inputs = _decode_rows(doc["instances"], spec, max_rows)
        columnar = False
    else:
        inputs = _decode_columns(doc["inputs"], spec, max_rows)
        columnar = True
    rows = next(iter(inputs.values())).shape[0]
    return inputs, rows, columnar


def _decode_rows(instances: Any, spec: FeatureSpec, max_rows: int) -> dict[str, np.ndarray]:
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("'instances' must be a non-empty list of rows")
    if len(instances) > max_rows:
        raise InvalidRequest(
            f"'instances' has {len(instances)} rows, at most {max_rows} are allowed"
        )
    names = list(spec)
    by_name = isinstance(instances[0], dict)
    if not by_name:
        if len(names) != 1:
            raise InvalidRequest(
                f"instances[0]: expected an object with features {names} (the model has "
                f"{len(names)} inputs)"
            )
        (name,) = names
        dtype, shape = spec[name]
        for i, row in enumerate(instances):
            if isinstance(row, dict):
                raise InvalidRequest(f"instances[{i}]: mixes objects and bare values across rows")
        arr = _to_array(instances, dtype, shape, name, f"instances.{name}", "instances[{i}].")
        return {name: arr}
    columns: dict[str, list[Any]] = {n: [] for n in names}
    wanted = set(names)
    for i, row in enumerate(instances):
        if not isinstance(row, dict):
            raise InvalidRequest(f"instances[{i}]: expected an object with features {names}")
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
        arr = _to_array(columns[name], dtype, shape, name, f"instances.{name}", "instances[{i}].")
        out[name] = arr
    return out


def _decode_columns(inputs: Any, spec: FeatureSpec, max_rows: int) -> dict[str, np.ndarray]:
    names = list(spec)
    if not isinstance(inputs, dict):
        if len(names) != 1:
            raise InvalidRequest(f"'inputs' must be an object with features {names}")
        inputs = {names[0]: inputs}
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InvalidRequest(f"inputs: missing feature {missing[0]!r}")
    extra = sorted(k for k in inputs if k not in spec)
    if extra:
        raise InvalidRequest(f"inputs: unknown feature {extra[0]!r} (expected {names})")
    out: dict[str, np.ndarray] = {}
    rows: int | None = None
    for name in names:
        dtype, shape = spec[name]
        values = inputs[name]
        if not isinstance(values, list) or not values:
            raise InvalidRequest(f"inputs.{name}: expected a non-empty list (one entry per row)")
        if len(values) > max_rows:
            raise InvalidRequest(
                f"inputs.{name}: {len(values)} rows, at most {max_rows} are allowed"
            )
        arr = _to_array(values, dtype, shape, f"inputs.{name}", f"inputs.{name}", "row {i} of ")
        if rows is not None and arr.shape[0] != rows:
            raise InvalidRequest(
                f"inputs.{name}: {arr.shape[0]} rows, but {names[0]!r} has {rows} "
                "(every feature needs the same batch size)"
            )
        rows = arr.shape[0]
        out[name] = arr
    return out


def _jsonable(arr: np.ndarray) -> Any:
    if arr.dtype.kind == "f" and arr.size and not np.all(np.isfinite(arr)):
        return (
            [_jsonable(a) for a in arr]
            if arr.ndim > 1
            else [v if math.isfinite(v) else str(v) for v in arr.astype(np.float64).tolist()]
        )
    if arr.dtype.kind in "SO":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in arr.tolist()]
    return arr.tolist()


def _row_texts(arr: np.ndarray) -> Any:
    """JSON text of each row of ``arr`` as an Arrow string array, built in C++.

    Floats print as their shortest round-trip decimal at their own precision (float32
    ``0.04786462``, not ``0.04786462336778641``). Returns None for what Arrow cannot print
    as JSON (non-finite floats, strings, objects, 0-d arrays); the caller falls back.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if arr.ndim == 0 or arr.dtype.kind not in "fiub":
        return None
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        return None
    texts = pc.cast(pa.array(np.ascontiguousarray(arr).reshape(-1)), pa.string())
    for size in reversed(arr.shape[1:]):
        count = len(texts) // size if size else arr.shape[0]
        offsets = pa.array(np.arange(count + 1, dtype=np.int32) * size)
        joined = pc.binary_join(pa.ListArray.from_arrays(offsets, texts), ",")
        texts = pc.binary_join_element_wise("[", joined, "]", "")
    return texts


def encode_predict_response(outputs: Mapping[str, np.ndarray], columnar: bool) -> bytes:
    """Encode model outputs in TF Serving's response shape.

    Args:
        outputs: Output name → array (batch first).
        columnar: True for ``{"outputs": ...}``, False for ``{"predictions": [...]}``.

    Returns:
        The JSON body. With one output the value is bare; with several, the columnar form
        is an object and the row form is one object per row, as TF Serving does.
    """
    import pyarrow.compute as pc

    names = sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    if sum(a.size for a in arrays.values()) < ARROW_ENCODE_MIN_VALUES:
        return _encode_with_json(arrays, names, columnar)
    rows = {n: _row_texts(a) for n, a in arrays.items()}
    if any(r is None for r in rows.values()):
        return _encode_with_json(arrays, names, columnar)

    def listed(texts: Any) -> str:
        return "[" + pc.binary_join(_pa_list(texts), ",")[0].as_py() + "]"

    if columnar:
        if len(names) == 1:
            return ('{"outputs":' + listed(rows[names[0]]) + "}").encode()
        body = ",".join(f"{json.dumps(n)}:{listed(rows[n])}" for n in names)
        return ('{"outputs":{' + body + "}}").encode()
    if len(names) == 1:
        return ('{"predictions":' + listed(rows[names[0]]) + "}").encode()
    parts: list[Any] = []
    for i, n in enumerate(names):
        parts += [("{" if i == 0 else ",") + json.dumps(n) + ":", rows[n]]
    per_row = pc.binary_join_element_wise(*parts, "}", "")
    return ('{"predictions":' + listed(per_row) + "}").encode()


def _pa_list(texts: Any) -> Any:
    """One Arrow list holding all of ``texts`` (to join them in C++)."""
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array([0, len(texts)], pa.int32()), texts)


def _encode_with_json(arrays: Mapping[str, np.ndarray], names: list[str], columnar: bool) -> bytes:
    cols = {n: _jsonable(arrays[n]) for n in names}
    if columnar:
        payload: Any = {"outputs": cols[names[0]] if len(names) == 1 else cols}
    elif len(names) == 1:
        payload = {"predictions": cols[names[0]]}
    else:
        rows = zip(*(cols[n] for n in names), strict=True)
        payload = {"predictions": [dict(zip(names, r, strict=True)) for r in rows]}
    return json.dumps(payload, separators=(",", ":")).encode()
