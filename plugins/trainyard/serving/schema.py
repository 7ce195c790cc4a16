"""Predict requests checked against a model's feature schema (TF Serving's REST formats).

A feature spec maps each serving input to ``(dtype, shape)`` with the batch dimension
first (``None``), exactly as ``trainyard.contracts.feature_spec`` returns it. Requests come
in TF Serving's row format (``{"instances": [...]}``) or columnar format
(``{"inputs": ...}``); both are decoded straight into numpy arrays and every mistake is
reported as one :class:`InvalidRequest` naming the row and the field. Pure numpy (and,
when built, the C parser ``_decode.c`` for float32 rows): no TensorFlow import.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import orjson

from trainyard import native
from trainyard.errors import TrainyardError

_decode = native.load("trainyard.serving._decode")  # None: numpy and Arrow parse instead

FeatureSpec = dict[str, tuple[str, tuple[int | None, ...]]]

NUMERIC_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
SUPPORTED_DTYPES = (*NUMERIC_DTYPES, "bool", "string")
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# TF Serving writes a DT_STRING output whose name ends so as {"b64": ...} (json_tensor.cc)
BYTES_SUFFIX = "_bytes"
SIGNATURE_NAME_ERROR = "'signature_name' key must be a string value."

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
    return {name: [dtype, list(shape)] for name, (dtype, shape) in spec.items()}


def _finite_float(text: str) -> float:
    """A JSON number; one beyond double range (``1e400``) is refused, not read as inf."""
    value = float(text)
    if math.isinf(value):
        raise InvalidRequest(f"number {text[:32]} out of range")
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


def _to_array(
    values: Any,
    dtype: str,
    shape: tuple[int | None, ...],
    field: str,
    where: str,
    row_prefix: str,
) -> np.ndarray:
    """Convert nested lists to an array of ``dtype`` and ``shape``.

    Strings, booleans for numbers, fractions for integers and ragged lists are rejected;
    shape errors name the first offending row. A ``string`` input takes JSON strings (as
    UTF-8 bytes) and ``{"b64": ...}`` objects (decoded), as TF Serving does. A missing
    value is ``null``: NaN in a float input (TF Serving's JSON takes ``NaN`` there),
    ``""`` in a string input (a model with preprocessing inside reads both as missing);
    an integer or boolean input has no missing value, and refuses it.
    """
    if dtype == "string":
        return _to_bytes_array(values, shape, field, where, row_prefix)
    try:
        arr = np.asarray(values)
    except ValueError:
        _diagnose_rows(values, shape, field, row_prefix)
        raise InvalidRequest(f"{where}: ragged nested lists") from None
    kind = arr.dtype.kind
    if kind == "O":
        flat = _flat_items(values)
        if dtype in _FLOAT_DTYPES and flat and all(type(v) in _NUMBER_OR_NULL for v in flat):
            try:  # null is a missing number: NaN
                arr = np.asarray(values, dtype=np.float64)
            except (ValueError, OverflowError):
                _diagnose_rows(values, shape, field, row_prefix)
                raise InvalidRequest(f"{where}: ragged nested lists") from None
            kind = "f"
        elif flat and all(type(v) in (int, float) for v in flat):
            # integers beyond 64 bits (JSON allows them): as floats, as TF Serving reads them
            try:
                arr = np.asarray(values, dtype=np.float64)
            except (ValueError, OverflowError):
                _diagnose_rows(values, shape, field, row_prefix)
                raise InvalidRequest(f"{where}: ragged nested lists") from None
            kind = "f"
    if kind == "O":
        if any(v is None for v in flat):
            what = "a missing number is null" if dtype in _FLOAT_DTYPES else "no missing value"
            raise InvalidRequest(f"{where}: expected {dtype} values ({what}), got {_mixed(flat)}")
        if any(isinstance(v, dict) for v in flat):
            raise InvalidRequest(f"{where}: expected {dtype} numbers, got an object")
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
    if kind == "f" and dtype not in ("float16", "float32", "float64"):
        if not np.all(np.isfinite(arr)):
            raise InvalidRequest(f"{where}: expected integers ({dtype}), got NaN or Infinity")
        if not np.all(arr == np.round(arr)):
            raise InvalidRequest(f"{where}: expected integers ({dtype}), got fractional numbers")
    if np.issubdtype(np.dtype(dtype), np.integer) and arr.size:
        info = np.iinfo(np.dtype(dtype))
        if arr.min() < info.min or arr.max() > info.max:
            raise InvalidRequest(f"{where}: value out of range for {dtype}")
    with np.errstate(over="ignore"):
        out = arr.astype(dtype, copy=False)
    if out.dtype.kind == "f" and arr.size:
        # a finite number beyond the dtype's range (1e39 as float32) is refused, not inf
        overflow = np.isinf(out) & np.isfinite(arr)
        if overflow.any():
            value = float(arr.reshape(-1)[int(np.flatnonzero(overflow.reshape(-1))[0])])
            raise InvalidRequest(f"{where}: value {value!r} out of range for {dtype}")
    return out


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
    values: Any, shape: tuple[int | None, ...], field: str, where: str, row_prefix: str
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
                _diagnose_rows(values, shape, field, row_prefix)
                raise InvalidRequest(f"{where}: ragged nested lists")
            stack.extend((item, level + 1) for item in reversed(v))
            continue
        if level != len(dims):
            raise InvalidRequest(f"{where}: ragged nested lists")
        if type(v) is str:
            flat.append(v.encode("utf-8", "surrogatepass"))
        elif is_b64_object(v):
            flat.append(decode_b64(v["b64"], where))
        elif v is None:
            flat.append(b"")  # missing: the empty string, as the model reads it
        else:
            raise InvalidRequest(
                f'{where}: expected strings or {{"b64": ...}} objects, got {type(v).__name__}'
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


# Below this size the per-call overhead of Arrow exceeds what it saves over json.
FAST_DECODE_MIN_BYTES = 8192

_FAST_HEAD = re.compile(rb'\s*\{\s*"(instances|inputs)"\s*:\s*(?:\{\s*"([^"\\]+)"\s*:\s*)?$')
_FAST_TAIL = re.compile(rb"\s*(\})?\s*\}\s*$")
_COMMA, _SPACE, _OPEN, _CLOSE, _MINUS, _ZERO = b", []-0"
_WHITESPACE = b" \t\r\n"
_FEW_EXPONENTS = 64
# Integer literals beyond this may round differently through float64 than through int64.
_EXACT_INTEGERS = 2.0**53


def _is_digit(chars: np.ndarray) -> np.ndarray:
    return (chars >= ord("0")) & (chars <= ord("9"))


class _RowBrackets(NamedTuple):
    """Where the brackets of one row of a regular nested list are, relative to its values.

    Attributes:
        opens: How many ``[`` come right before each value of the row (row order).
        closes: How many ``]`` come right after each value.
        open_at: The value each ``[`` precedes, and how far before its first character.
        close_at: The value each ``]`` follows, and how far after its end (0: right after).
    """

    opens: np.ndarray
    closes: np.ndarray
    open_at: tuple[np.ndarray, np.ndarray]
    close_at: tuple[np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=64)
def _row_brackets(row_shape: tuple[int, ...]) -> _RowBrackets:
    per_row = math.prod(row_shape)
    opens = np.zeros(per_row, np.int64)
    closes = np.zeros(per_row, np.int64)
    stride = per_row
    for size in row_shape:
        opens[::stride] += 1
        closes[stride - 1 :: stride] += 1
        stride //= size
    values = np.arange(per_row)
    open_at = np.repeat(values, opens), np.concatenate([np.arange(n, 0, -1) for n in opens])
    close_at = np.repeat(values, closes), np.concatenate([np.arange(n) for n in closes])
    return _RowBrackets(opens, closes, open_at, close_at)


def _spelled_as_json(
    body: bytes, start: int, end: int, a: np.ndarray, first: np.ndarray, stop: np.ndarray
) -> bool:
    """Whether every number ``a[first:stop]`` is spelled as JSON requires.

    ``a`` is ``body[start:end]`` as a uint8 array. Arrow's parser also takes ``.5``,
    ``5.``, ``+5``, ``05``, ``5.e1``, ``inf`` and ``nan``, which JSON (and so the ``json``
    path) rejects.
    """
    lead = a[first]
    digit_at = first + (lead == _MINUS)
    digit = a[digit_at]
    if not _is_digit(digit).all() or ((digit == _ZERO) & _is_digit(a[digit_at + 1])).any():
        return False
    if not _is_digit(a[stop - 1]).all():
        return False
    # "e" must follow a digit ("5.e1" is not JSON). Exponents are rare: find them with
    # memchr while they are few.
    exponents: list[int] = []
    for letter in (b"e", b"E"):
        at = body.find(letter, start, end)
        while at >= 0 and len(exponents) < _FEW_EXPONENTS:
            exponents.append(at - start)
            at = body.find(letter, at + 1, end)
        if at >= 0:
            return bool(_is_digit(a[np.flatnonzero((a | 0x20) == ord("e")) - 1]).all())
    return bool(_is_digit(a[np.array(exponents, np.int64) - 1]).all())


def _parse_float64(body: bytes, first: np.ndarray, stop: np.ndarray) -> np.ndarray | None:
    """Parse each ``body[first:stop]`` as a number with Arrow (``fast_float``, in C++).

    The numbers and the bytes between them become the values of a zero-copy Arrow string
    array whose in-between values are marked null, so only the numbers are parsed.
    Returns None if one is not a number.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = first.size
    offsets = np.empty(2 * n + 2, np.int32)
    offsets[0] = 0
    offsets[1:-1:2] = first
    offsets[2:-1:2] = stop
    offsets[-1] = len(body)
    odd_valid = np.full((2 * n + 8) // 8, 0b10101010, np.uint8)
    strings = pa.StringArray.from_buffers(
        2 * n + 1, pa.py_buffer(offsets), pa.py_buffer(body), pa.py_buffer(odd_valid)
    )
    try:
        parsed = pc.cast(strings, pa.float64())
    except (pa.ArrowInvalid, ValueError):
        return None
    return np.frombuffer(parsed.buffers()[1], np.float64, count=2 * n + 1)[1::2].copy()


def _parse_number_rows(
    body: bytes, start: int, end: int, row_shape: tuple[int, ...]
) -> np.ndarray | None:
    """Parse ``body[start:end]``, a JSON array of rows of ``row_shape`` numbers, as float64.

    Every comma ends a value, and a row's values sit in the same brackets in every row, so
    from the comma positions alone follow where each value and each bracket must be; a
    gather checks the brackets and Arrow parses the values in between (which fails on
    anything but a number there). Compact text and ``json.dumps``' default (a space after
    each comma) are read as they are; other whitespace is removed first.

    Returns:
        The values, shape ``(rows, *row_shape)``; None if the text is anything else (not
        JSON, ragged, other shape, non-finite or inexact numbers): the ``json`` path decides.
    """
    if end - start < 3 or end >= 2**31:
        return None
    a = np.frombuffer(body, np.uint8, count=end - start, offset=start)
    commas = np.flatnonzero(a == _COMMA)
    after = a[commas[0] + 1] if commas.size else a[1]
    gap = int(after == _SPACE)
    if after > _SPACE or (gap and (a[commas + 1] == _SPACE).all()):
        values = _parse_laid_out(body, start, end, a, commas, gap, row_shape)
        if values is not None:
            return values
    if np.count_nonzero(a <= _SPACE) == gap * commas.size:
        return None  # no whitespace but after the commas: not a matter of layout
    return _parse_spaced_number_rows(body[start:end], a, row_shape)


def _parse_laid_out(
    body: bytes,
    start: int,
    end: int,
    a: np.ndarray,
    commas: np.ndarray,
    gap: int,
    row_shape: tuple[int, ...],
) -> np.ndarray | None:
    """:func:`_parse_number_rows` for text whose only whitespace is ``gap`` after commas."""
    brackets = _row_brackets(row_shape)
    per_row = brackets.opens.size
    rows, rem = divmod(commas.size + 1, per_row)
    if rem or not rows:
        return None
    # A value starts after the previous comma (or the array's "["), ends at the next comma
    # (or the array's "]"), and has its row position's brackets around it.
    first = np.empty(rows * per_row, np.int64)
    first[0] = 1
    np.add(commas, 1 + gap, out=first[1:])
    stop = np.empty(rows * per_row, np.int64)
    stop[:-1] = commas
    stop[-1] = a.size - 1
    first = first.reshape(rows, per_row) + brackets.opens
    stop = stop.reshape(rows, per_row) - brackets.closes
    if not (stop > first).all():
        return None
    values_of, back = brackets.open_at
    if not (a[first[:, values_of] - back] == _OPEN).all():
        return None
    values_of, ahead = brackets.close_at
    if not (a[stop[:, values_of] + ahead] == _CLOSE).all():
        return None
    first, stop = first.reshape(-1), stop.reshape(-1)
    if not _spelled_as_json(body, start, end, a, first, stop):
        return None
    values = _parse_float64(body, first + start, stop + start)
    if values is None or not -_EXACT_INTEGERS < values.min() <= values.max() < _EXACT_INTEGERS:
        return None
    zero = values == 0
    if zero.any():
        # json reads the integer "-0" as 0, so it must become +0.0, not -0.0.
        values[zero & (stop - first == 2) & (a[first] == _MINUS)] = 0.0
    return values.reshape(rows, *row_shape)


def _parse_spaced_number_rows(
    text: bytes, a: np.ndarray, row_shape: tuple[int, ...]
) -> np.ndarray | None:
    """:func:`_parse_number_rows` for text with whitespace elsewhere (indented, say).

    Whitespace is removed first; that must not join two numbers ("1 2" → "12"), so the
    runs of number characters in ``text`` (``a``) are counted and must match the values.
    """
    compact = text.translate(None, _WHITESPACE)
    values = _parse_number_rows(compact, 0, len(compact), row_shape)
    if values is None:
        return None
    # The compact text held only numbers, brackets and commas; the rest was whitespace.
    # Between the "[" that opens the text and the "]" that closes it, each run of number
    # characters starts and ends one change from the others to numbers and back.
    other = a <= _SPACE
    for char in (_COMMA, _OPEN, _CLOSE):
        np.logical_or(other, a == char, out=other)
    runs = np.count_nonzero(other[1:] != other[:-1]) // 2
    return values if runs == values.size else None


def _fast_decode(body: bytes, spec: FeatureSpec) -> tuple[dict[str, np.ndarray], int, bool] | None:
    """Decode a single-feature float request without building Python lists.

    Applies to ``{"instances": ARRAY}``, ``{"inputs": ARRAY}`` and ``{"inputs": {"f":
    ARRAY}}`` where ARRAY is a regular nested list of plain numbers in the feature's fixed
    row shape (see :func:`_parse_number_rows`). Anything else (or anything doubtful)
    returns None and takes the ``json`` path, which also produces the precise error
    messages; whatever this accepts, the ``json`` path decodes to the same array.
    """
    if len(spec) != 1:
        return None
    ((name, (dtype, shape)),) = spec.items()
    row_shape = shape[1:]
    if dtype not in ("float16", "float32", "float64") or any(not d for d in row_shape):
        return None
    start, end = body.find(b"["), body.rfind(b"]")
    if start < 0 or end < start:
        return None
    head = _FAST_HEAD.match(body, 0, start)
    tail = _FAST_TAIL.match(body, end + 1)
    if head is None or tail is None or (head[2] is None) != (tail[1] is None):
        return None
    columnar = head[1] == b"inputs"
    # bytes, not text: a key that is not UTF-8 is the json path's to refuse (400)
    if head[2] is not None and (not columnar or head[2] != name.encode()):
        return None
    if dtype == "float32" and _decode is not None and type(body) is bytes:
        # one pass in C, bit-identical to the json path; None: the json path decides
        got = _decode.float32_rows(body, start, end + 1, row_shape)
        if got is None:
            return None
        data, rows = got
        arr = np.frombuffer(data, np.float32).reshape(rows, *row_shape)
        if not np.isfinite(arr).all():  # an overflow to inf: the json path names it
            return None
        return {name: arr}, rows, columnar
    values = _parse_number_rows(body, start, end + 1, row_shape)  # type: ignore[arg-type]
    if values is None:
        return None
    cast = values.astype(dtype)
    if not np.isfinite(cast).all():
        return None
    return {name: cast}, values.shape[0], columnar


class DecodedRequest(NamedTuple):
    """A decoded ``:predict`` request.

    Attributes:
        inputs: One array per input (batch first).
        rows: The batch size.
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
    if len(body) >= FAST_DECODE_MIN_BYTES:
        # a body the fast path takes names no signature: its head and tail are fixed
        try:
            default: FeatureSpec | None = specs("")
        except (InvalidRequest, LookupError):  # no default signature: the body must name one
            default = None
        fast = _fast_decode(body, default) if default is not None else None
        if fast is not None:
            if fast[1] > max_rows:
                raise InvalidRequest(f"request has {fast[1]} rows, at most {max_rows} are allowed")
            return DecodedRequest(*fast, "")
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
    if "instances" in doc:
        inputs = _decode_rows(doc["instances"], spec, max_rows)
        columnar = False
    else:
        inputs = _decode_columns(doc["inputs"], spec, max_rows)
        columnar = True
    rows = next(iter(inputs.values())).shape[0] if inputs else 0
    return DecodedRequest(inputs, rows, columnar, signature)


def parse_json_object(body: bytes, expected: str) -> dict[str, Any]:
    """A request body as a JSON object, ``NaN``/``Infinity`` accepted, numbers in range.

    Args:
        body: The raw body.
        expected: What the object should hold, for the error message.

    Raises:
        InvalidRequest: If the body is not a JSON object.
    """
    try:
        doc = json.loads(body, parse_constant=_nonfinite_constant, parse_float=_finite_float)
    except InvalidRequest:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"malformed JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest("malformed JSON: nested too deeply") from None
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
        ``(inputs, rows, columnar)``: one array per feature (batch first), the batch size,
        and whether the request used the columnar ``inputs`` format.

    Raises:
        InvalidRequest: As :func:`decode_request`; also for any signature but the default.
    """

    def only_default(name: str) -> FeatureSpec:
        if name not in ("", DEFAULT_SIGNATURE):
            raise InvalidRequest(f'Serving signature key "{name}" not found.')
        return spec

    inputs, rows, columnar, _ = decode_request(body, only_default, max_rows)
    return inputs, rows, columnar


def _decode_rows(instances: Any, spec: FeatureSpec, max_rows: int) -> dict[str, np.ndarray]:
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("'instances' must be a non-empty list of rows")
    if len(instances) > max_rows:
        raise InvalidRequest(
            f"'instances' has {len(instances)} rows, at most {max_rows} are allowed"
        )
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
        arr = _to_array(instances, dtype, shape, name, f"instances.{name}", "instances[{i}].")
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
        arr = _to_array(columns[name], dtype, shape, name, f"instances.{name}", "instances[{i}].")
        out[name] = arr
    return out


def _decode_columns(inputs: Any, spec: FeatureSpec, max_rows: int) -> dict[str, np.ndarray]:
    names = list(spec)
    if not isinstance(inputs, dict) or is_b64_object(inputs):
        if len(names) != 1:
            raise InvalidRequest(f"'inputs' must be an object with features {names}")
        inputs = {names[0]: inputs}
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InvalidRequest(f"inputs: missing feature {missing[0]!r}")
    # inputs the signature does not take are ignored, as TF Serving does
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


def tf_float_text(value: float, float32: bool) -> str:
    """One float as TF Serving prints it (``json_tensor.cc``, ``WriteDecimal``).

    Six significant digits (printf ``%g``) when they read back as the same value, else
    ``%.9g`` (float32) or ``%.17g`` (float64); ``.0`` appended to a whole number printed
    without an exponent; ``NaN``, ``Infinity``, ``-Infinity``. So ``9e+06``, ``999999.0``,
    ``0.5``, ``3e-05`` and ``0.0478646196``.
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = f"{value:g}"
    back = float(np.float32(text)) if float32 else float(text)
    if back != value:
        text = f"{value:.9g}" if float32 else f"{value:.17g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _nested(tokens: list[str], shape: tuple[int, ...]) -> bytes:
    """Flat number texts as nested JSON arrays of ``shape`` (C order)."""
    if 0 in shape:
        return orjson.dumps(np.zeros(shape, np.int8), option=orjson.OPT_SERIALIZE_NUMPY)
    parts = tokens
    for size in reversed(shape):
        parts = ["[" + ",".join(parts[i : i + size]) + "]" for i in range(0, len(parts), size)]
    return parts[0].encode()


def dump_array(arr: np.ndarray) -> bytes:
    """Print one numeric array as JSON text, floats as TF Serving prints them.

    Integers and booleans as orjson prints them; floats by :func:`tf_float_text`'s rule,
    float32 (and float16, widened as TF Serving does) in C when ``_decode`` is built.
    """
    if arr.dtype.kind != "f":
        return orjson.dumps(np.ascontiguousarray(arr), option=orjson.OPT_SERIALIZE_NUMPY)
    float32 = arr.dtype.itemsize <= 4
    if float32:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if _decode is not None and arr.size:
            return _decode.float32_json(arr, arr.shape)
    tokens = [tf_float_text(v, float32) for v in arr.reshape(-1).tolist()]
    return _nested(tokens, arr.shape)


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _b64(v: Any) -> dict[str, str]:
    return {"b64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()}


def _jsonable(arr: np.ndarray, as_b64: bool = False) -> Any:
    """An output (or one row of it) as JSON values; strings as text or ``{"b64": ...}``."""
    if arr.dtype.kind in "SO":
        convert = _b64 if as_b64 else _text
        flat = np.empty(arr.size, dtype=object)
        flat[:] = [convert(v) for v in arr.reshape(-1).tolist()]
        return flat.reshape(arr.shape).tolist() if arr.ndim else flat[0]
    if arr.ndim == 0:
        return orjson.Fragment(dump_array(arr.reshape(1))[1:-1])
    return orjson.Fragment(dump_array(arr))


def _row_values(arr: np.ndarray, as_b64: bool) -> list[Any]:
    """One JSON value per row (batch entry) of an output."""
    if arr.dtype.kind in "SO":
        return [_jsonable(np.asarray(row, dtype=object), as_b64) for row in arr]
    return [orjson.Fragment(dump_array(arr[i : i + 1])[1:-1]) for i in range(len(arr))]


def _orjson_can_encode(arr: np.ndarray) -> bool:
    """Whether an output is numeric (printed from numpy), not text or a scalar."""
    return arr.ndim > 0 and arr.dtype.kind in "fiub"


def encode_predict_response(outputs: Mapping[str, np.ndarray], columnar: bool) -> bytes:
    """Encode model outputs in TF Serving's response shape.

    Numeric outputs are printed by orjson straight from numpy, floats as their shortest
    round-trip decimal at their own precision (float32 ``0.04786462``, not
    ``0.04786462336778641``); non-finite floats and strings take the ``json`` path.

    Args:
        outputs: Output name → array (batch first).
        columnar: True for ``{"outputs": ...}``, False for ``{"predictions": [...]}``.

    Returns:
        The JSON body. With one output the value is bare; with several, the columnar form
        is an object and the row form is one object per row, as TF Serving does. String
        outputs whose name ends in ``_bytes`` are written as ``{"b64": ...}``.

    Raises:
        InvalidRequest: In the row format, for an output without a batch dimension or with
            another batch size than the others (TF Serving's messages).
    """
    names = sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    if not columnar:
        _check_row_outputs(arrays)
    if not all(_orjson_can_encode(a) for a in arrays.values()):
        return _encode_with_json(arrays, names, columnar)
    arrays = {n: np.ascontiguousarray(a) for n, a in arrays.items()}
    if columnar:
        frags = {n: orjson.Fragment(dump_array(a)) for n, a in arrays.items()}
        payload: Any = {"outputs": frags[names[0]] if len(names) == 1 else frags}
    elif len(names) == 1:
        payload = {"predictions": orjson.Fragment(dump_array(arrays[names[0]]))}
    elif all(a.size for a in arrays.values()):
        return _encode_row_objects(arrays, names)
    else:
        cols = [list(a) for a in arrays.values()]
        payload = {
            "predictions": [dict(zip(names, row, strict=True)) for row in zip(*cols, strict=True)]
        }
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def _encode_row_objects(arrays: Mapping[str, np.ndarray], names: list[str]) -> bytes:
    """``{"predictions": [{name: row value, ...}, ...]}`` from each output's orjson text.

    orjson prints each (non-empty) output whole; its rows are split apart at the one
    separator that only occurs between rows (``],[`` one level below the top, ``]],[[``
    two, ...), then interleaved with the names and joined once.
    """
    rows = next(iter(arrays.values())).shape[0]
    depths = [arrays[n].ndim - 1 for n in names]
    parts: list[bytes] = [b""] * (2 * len(names) * rows)
    for i, (name, depth) in enumerate(zip(names, depths, strict=True)):
        text = dump_array(arrays[name])
        values = text[1 + depth : -1 - depth].split(b"]" * depth + b"," + b"[" * depth)
        # Before each value: the end of the previous one (or of the previous row's object).
        before = b"]" * depths[i - 1] + b"," if i else b"]" * depths[-1] + b"},{"
        parts[2 * i :: 2 * len(names)] = [before + orjson.dumps(name) + b":" + b"[" * depth] * rows
        parts[2 * i + 1 :: 2 * len(names)] = values
    parts[0] = b'{"predictions":[{' + orjson.dumps(names[0]) + b":" + b"[" * depths[0]
    return b"".join(parts) + b"]" * depths[-1] + b"}]}"


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


def _encode_with_json(arrays: Mapping[str, np.ndarray], names: list[str], columnar: bool) -> bytes:
    """Text outputs (or scalars) among the outputs: each value as orjson prints it."""
    if columnar or len(names) == 1:
        cols = {n: _jsonable(arrays[n], n.endswith(BYTES_SUFFIX)) for n in names}
        if columnar:
            payload: Any = {"outputs": cols[names[0]] if len(names) == 1 else cols}
        else:
            payload = {"predictions": cols[names[0]]}
    else:
        rows = [_row_values(arrays[n], n.endswith(BYTES_SUFFIX)) for n in names]
        payload = {
            "predictions": [dict(zip(names, r, strict=True)) for r in zip(*rows, strict=True)]
        }
    return orjson.dumps(payload)
