"""Check streamed records against the dataset's contract, one record at a time.

A record is a JSON object whose fields are contract columns. It must carry the key and
every feature that cannot be missing; any other contract column it carries (the label,
descriptive columns) is checked too; a field the contract does not know is refused unless
the contract allows extra columns. A value is missing when it is null, absent, or a string
equal to one of the contract's null markers (``source.null_values``), whatever the
column's type: as staging reads a CSV cell. Each column's ``error`` rules apply (type,
null, bounds, allowed values, regex, length); ``warn`` rules and dataset-level rules
(uniqueness, row counts, drift, all values present) do not apply to a single record. A
failing record gets one reason naming the field and the rule, which the scorer writes to
the dead-letter stream.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from trainyard import native
from trainyard.contracts import INT_RANGES, MISSING_CATEGORY, Column, Contract, feature_spec
from trainyard.errors import ConfigError

Check = Callable[[Any], str | None]
_hotpath = native.load("trainyard.streaming._hotpath")
EXACT_INT = 2**53
"""Integers up to this are exact doubles (a bound beyond it keeps a contract in Python)."""


def _type_check(col: Column) -> Check:
    if col.type == "string":

        def check(v: Any) -> str | None:
            return None if isinstance(v, str) else f"expected a string, got {show_value(v)}"

    elif col.type in ("int32", "int64"):
        lowest, highest = INT_RANGES[col.type]

        def check(v: Any) -> str | None:
            if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
                return f"expected an integer, got {show_value(v)}"
            # integers beyond 64 bits arrive as floats, rounded (-2**63 - 1 to -2**63)
            if not lowest <= v <= highest or (isinstance(v, float) and abs(v) >= 2**63):
                return f"{show_value(v)} is outside the {col.type} range"
            if isinstance(v, float):  # 3.0, 1e3: JSON Lines staging refuses them too
                return f"expected an integer, got {show_value(v)}"
            return None

    elif col.type in ("float32", "float64"):

        def check(v: Any) -> str | None:
            if isinstance(v, bool) or not isinstance(v, int | float):
                return f"expected a number, got {show_value(v)}"
            if isinstance(v, float) and not math.isfinite(v):
                return f"expected a finite number, got {v}"
            return None

    elif col.type == "bool":

        def check(v: Any) -> str | None:
            return None if isinstance(v, bool) else f"expected true or false, got {show_value(v)}"

    else:  # date, timestamp, binary...: a string in JSON

        def check(v: Any) -> str | None:
            if isinstance(v, str):
                return None
            return f"expected a {col.type} string, got {show_value(v)}"

    return check


def show_value(v: Any) -> str:
    """A value as a reason shows it: its repr, cut to 40 characters."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _column_checks(col: Column) -> list[Check]:
    """The column's blocking rules as checks of a non-null value (type first)."""
    checks = [_type_check(col)]

    def blocking(rule: str) -> bool:
        return col.severity_of(rule) == "error"

    if col.min is not None and blocking("min"):
        lo, excl = col.min, col.min_exclusive
        checks.append(
            lambda v: (
                f"{show_value(v)} is below the minimum {lo:g}{' (exclusive)' if excl else ''}"
                if (v <= lo if excl else v < lo)
                else None
            )
        )
    if col.max is not None and blocking("max"):
        hi, excl_hi = col.max, col.max_exclusive
        checks.append(
            lambda v: (
                f"{show_value(v)} is above the maximum {hi:g}{' (exclusive)' if excl_hi else ''}"
                if (v >= hi if excl_hi else v > hi)
                else None
            )
        )
    if col.allowed_values is not None and blocking("allowed_values"):
        allowed = set(col.allowed_values)
        checks.append(
            lambda v: None if v in allowed else f"{show_value(v)} is not an allowed value"
        )
    if col.regex is not None and blocking("regex"):
        pattern = re.compile(col.value_regex)
        checks.append(
            lambda v: None if pattern.search(v) else f"{show_value(v)} does not match {col.regex!r}"
        )
    if col.min_length is not None and blocking("min_length"):
        n = col.min_length
        checks.append(lambda v: None if len(v) >= n else f"shorter than {n} characters")
    if col.max_length is not None and blocking("max_length"):
        m = col.max_length
        checks.append(lambda v: None if len(v) <= m else f"longer than {m} characters")
    return checks


FastCheck = Callable[[list[Any], object], "np.ndarray | None"]


def _fast_check(col: Column, required: bool, markers: frozenset[str]) -> FastCheck:
    """A vectorised over-approximation of a column's rules.

    It flags (True) every value :meth:`RecordChecker.check` might refuse (and a few it
    accepts, such as nulls and null markers) and never passes one it refuses; None when
    nothing is flagged.
    """

    def blocking(rule: str) -> bool:
        return col.severity_of(rule) == "error"

    lo = col.min if col.min is not None and blocking("min") else None
    hi = col.max if col.max is not None and blocking("max") else None
    allowed = (
        frozenset(col.allowed_values)
        if col.allowed_values is not None and blocking("allowed_values")
        else None
    )
    if col.type in ("float32", "float64", "int32", "int64"):
        kinds = (float, int) if col.type.startswith("float") else (int,)
        kind_set = frozenset(kinds)
        # float64 is exact for int32's range; int64's edge is left to check() (2**62 on)
        span = {"int32": INT_RANGES["int32"], "int64": (-(2**62), 2**62)}.get(col.type)

        def fast(values: list[Any], missing: object) -> np.ndarray | None:
            if set(map(type, values)) <= kind_set:  # the common case, at C speed
                try:
                    x = np.array(values, dtype=np.float64)
                except OverflowError:
                    return np.ones(len(values), dtype=bool)
                with np.errstate(invalid="ignore"):
                    flags = ~np.isfinite(x)
                    if span is not None:
                        flags |= (x < span[0]) | (x > span[1])
                    if lo is not None:
                        flags |= (x <= lo) if col.min_exclusive else (x < lo)
                    if hi is not None:
                        flags |= (x >= hi) if col.max_exclusive else (x > hi)
                if allowed is not None and not set(values) <= allowed:
                    flags |= np.fromiter((v not in allowed for v in values), bool, len(values))
                return flags if flags.any() else None
            return mixed(values, missing)

        def mixed(values: list[Any], missing: object) -> np.ndarray | None:
            flags = np.fromiter(
                (type(v) not in kinds for v in values), dtype=bool, count=len(values)
            )
            if not required:  # absent optional columns are fine; nulls go the slow way
                flags &= np.fromiter((v is not missing for v in values), bool, len(values))
            try:
                x = np.fromiter(
                    (v if type(v) in kinds else 0.0 for v in values), np.float64, len(values)
                )
            except OverflowError:  # an integer beyond float64: let check() decide
                return np.ones(len(values), dtype=bool)
            with np.errstate(invalid="ignore"):
                flags |= ~np.isfinite(x)
                if span is not None:
                    flags |= (x < span[0]) | (x > span[1])
                if lo is not None:
                    flags |= (x <= lo) if col.min_exclusive else (x < lo)
                if hi is not None:
                    flags |= (x >= hi) if col.max_exclusive else (x > hi)
            if allowed is not None:  # other types are flagged above (and may not hash)
                flags |= np.fromiter(
                    (type(v) in kinds and v not in allowed for v in values), bool, len(values)
                )
            if not required:
                flags &= np.fromiter((v is not missing for v in values), bool, len(values))
            return flags if flags.any() else None

        return fast
    checks = _column_checks(col)
    pattern = re.compile(col.value_regex) if col.regex is not None and blocking("regex") else None
    min_len = col.min_length if blocking("min_length") else None
    max_len = col.max_length if blocking("max_length") else None

    def strings(values: list[Any], missing: object) -> np.ndarray | None:
        if (
            col.type == "string"
            and values
            and set(map(type, values)) <= {str}
            and (
                (pattern is None or all(map(pattern.search, values)))
                and (min_len is None or min(map(len, values)) >= min_len)
                and (max_len is None or max(map(len, values)) <= max_len)
                and (allowed is None or set(values) <= allowed)
                and markers.isdisjoint(values)
            )
        ):
            return None  # every value passes every rule
        return slow(values, missing)

    def slow(values: list[Any], missing: object) -> np.ndarray | None:
        flags = np.fromiter(
            (
                (v is not missing or required)
                and (v is None or v is missing or any(c(v) is not None for c in checks))
                for v in values
            ),
            dtype=bool,
            count=len(values),
        )
        return flags if flags.any() else None

    return strings


def _int_or_float(text: str) -> int | float:
    """An integer literal, as a float (inf beyond float64) when it does not fit 64 bits.

    orjson reads such numbers as floats too; the check then names the field.
    """
    if len(text) <= 21:  # may fit 64 bits (a sign and 20 digits); int() takes at most 4,300
        value = int(text)
        if -(2**63) <= value < 2**64:
            return value
    return float(text)


def _not_json(raw: bytes, error: Exception) -> str:
    """Why ``raw`` is no record: orjson's words, or where it is not UTF-8 text."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not JSON: not UTF-8 text (byte {raw[e.start]:#04x} at {e.start}: {e.reason})"
    return f"not JSON: {error}"


def _lenient(raw: bytes) -> Any:
    """``raw`` read by Python's ``json`` (it takes NaN, Infinity, numbers beyond float64).

    Integers beyond 64 bits are read as floats (:func:`_int_or_float`).

    Returns:
        The record, or None when it is not JSON even so, or holds what orjson cannot
        write back (lone surrogates) and so the scorer could not.
    """
    import json

    try:
        record = json.loads(raw, parse_int=_int_or_float)
        orjson.dumps(record)
    except (ValueError, TypeError, RecursionError):
        return None
    return record


def _passing(records: list[Any], reasons: list[str | None]) -> list[Any]:
    return [r for r, why in zip(records, reasons, strict=True) if why is None]


def _exact_bound(value: float | None) -> float | None:
    """A bound as the C checker's double, or raise ValueError if that is not exact."""
    if value is None:
        return None
    if isinstance(value, int) and abs(value) > EXACT_INT:
        raise ValueError(value)
    return float(value)


def hot_plan(contract: Contract, features: list[str], required: frozenset[str]) -> tuple | None:
    """The contract's per-record rules for the C checker (``_hotpath.check_rows``).

    Returns:
        ``(columns, text_patterns)``: a tuple per column, and the compiled regexes of the
        columns whose strings the caller matches itself; None when a rule is beyond the C
        checker (a bound on a non-number, a length or regex on a non-string, a bound
        beyond 2**53, a feature that is not a number): the Python checks then run alone.
    """
    kinds = {"int32": 1, "int64": 1, "float32": 2, "float64": 2, "bool": 3}
    columns, patterns = [], []
    for c in contract.columns:
        kind = kinds.get(c.type, 0)  # any other type is a string in JSON

        def blocking(rule: str, col: Column = c) -> bool:
            return col.severity_of(rule) == "error"

        try:
            lo = _exact_bound(c.min if blocking("min") else None)
            hi = _exact_bound(c.max if blocking("max") else None)
        except ValueError:
            return None
        lo_excl, hi_excl = c.min_exclusive, c.max_exclusive
        if c.type == "int32":  # its range flags what lies beyond, for check() to word
            lowest, highest = INT_RANGES["int32"]
            if lo is None or lo < lowest:
                lo, lo_excl = float(lowest), False
            if hi is None or hi > highest:
                hi, hi_excl = float(highest), False
        min_len = c.min_length if c.min_length is not None and blocking("min_length") else -1
        max_len = c.max_length if c.max_length is not None and blocking("max_length") else -1
        regex = c.value_regex if blocking("regex") else None
        if kind == 0 and (lo is not None or hi is not None):
            return None
        if kind != 0 and (min_len >= 0 or max_len >= 0 or regex is not None):
            return None
        feature = features.index(c.name) if c.name in features else -1
        if feature >= 0 and kind == 0:
            return None
        allowed = (
            frozenset(c.allowed_values)
            if c.allowed_values is not None and blocking("allowed_values")
            else None
        )
        text = -1
        if regex is not None:
            text = len(patterns)
            patterns.append(re.compile(regex))
        null_ok = (c.nullable or c.severity_of("nullable") == "warn") and c.name not in required
        columns.append(
            (c.name, kind, c.name in required, null_ok, lo, lo_excl, hi, hi_excl, allowed,
             min_len, max_len, feature, text)
        )  # fmt: skip
    if any(f not in [c[0] for c in columns] for f in features):
        return None
    return tuple(columns), patterns


class RecordChecker:
    """A contract's per-record rules, compiled once.

    Attributes:
        key: The key column (the record id).
        features: The model's feature columns, in contract order.
    """

    def __init__(self, contract: Contract) -> None:
        """Compile the contract's rules.

        Raises:
            ConfigError: If the contract's model takes an image (stream scoring scores
                table datasets: one JSON record per row).
        """
        if contract.image is not None:
            raise ConfigError(
                f"dataset {contract.dataset!r}: stream scoring takes table records; its "
                f"contract's feature {contract.image.column!r} is an image"
            )
        self.contract = contract
        self.key = contract.roles.key
        self.features = list(contract.roles.features)
        self.spec = feature_spec(contract)
        self.null_values = frozenset(contract.source.null_values)
        self._checks: dict[str, tuple[bool, list[Check]]] = {
            c.name: (c.nullable or c.severity_of("nullable") == "warn", _column_checks(c))
            for c in contract.columns
        }
        self._missing_ok = {f for f in self.features if contract.feature(f).nullable}
        self._required = [self.key, *(f for f in self.features if f not in self._missing_ok)]
        self._extra_ok = contract.allow_extra_columns
        self._required_keys = frozenset(self._required)
        self._known_keys = frozenset(self._checks)
        self._fast = [
            (c.name, _fast_check(c, c.name in self._required_keys, self.null_values))
            for c in contract.columns
        ]
        self._hot = (
            hot_plan(contract, self.features, self._required_keys)
            if _hotpath and self._plain_numbers(contract)
            else None
        )

    def _plain_numbers(self, contract: Contract) -> bool:
        """Whether the C checker decides as :meth:`check` does.

        It does for numeric features that are never missing, when no string column would
        take a null marker for a value.
        """
        if self._missing_ok or any(contract.feature(f).categorical for f in self.features):
            return False
        for c in contract.columns:
            if c.type == "string":
                checks = _column_checks(c)
                if any(all(chk(m) is None for chk in checks) for m in self.null_values):
                    return False
        return True

    def check(self, record: Any) -> str | None:
        """The reason ``record`` fails the contract, or None if it passes."""
        if not isinstance(record, dict):
            return f"not a JSON object ({type(record).__name__})"
        for name in self._required:
            if name not in record:
                return f"{name}: missing (the key and every feature are required)"
        for name, value in record.items():
            spec = self._checks.get(name)
            if spec is None:
                if self._extra_ok:
                    continue
                return f"{name}: unknown field (not a column of the contract)"
            nullable, checks = spec
            if value is None or (type(value) is str and value in self.null_values):
                if nullable and name not in self._required:
                    continue
                return f"{name}: null" if value is None else f"{name}: null ({value!r})"
            for check in checks:
                reason = check(value)
                if reason is not None:
                    return f"{name}: {reason}"
        return None

    def check_batch(self, records: list[Any]) -> list[str | None]:
        """:meth:`check` for many records at once: the same answers, faster.

        A column at a time, the common case (right type, within bounds, allowed) is
        decided for every record together (bounds in numpy); a record anything looks
        wrong with goes through :meth:`check`, which gives its reason.
        """
        required = self._required_keys
        if self._extra_ok:
            suspect = [type(r) is not dict or not (required <= r.keys()) for r in records]
        else:
            known = self._known_keys
            suspect = [type(r) is not dict or not (required <= r.keys() <= known) for r in records]
        ok = [i for i, s in enumerate(suspect) if not s]
        rows = records if len(ok) == len(records) else [records[i] for i in ok]
        for name, fast in self._fast:
            if not ok:
                break
            missing = object()
            bad = fast([r.get(name, missing) for r in rows], missing)
            if bad is not None:
                for j in np.flatnonzero(bad):
                    suspect[ok[j]] = True
                ok = [i for i in ok if not suspect[i]]
                rows = [records[i] for i in ok]
        if not any(suspect):
            return [None] * len(records)
        return [self.check(r) if suspect[i] else None for i, r in enumerate(records)]

    def parse(self, raw: bytes) -> tuple[Any, str | None]:
        """Decode one record's bytes and check it: ``(record, reason or None)``."""
        (record,), reasons = self.parse_batch([raw])
        return record, reasons[0]

    @staticmethod
    def _decode(raws: list[bytes]) -> tuple[list[Any], dict[int, str]]:
        """Each record decoded (None if it is not JSON), and why those are not.

        A record orjson refuses for ``NaN``, ``Infinity`` or a number beyond float64, as
        Python's ``json`` writes them by default, is read by ``json`` instead, so that the
        check names the field (``amount: expected a finite number, got nan``); anything
        else orjson refuses stays refused with its message.
        """
        records: list[Any] = []
        errors: dict[int, str] = {}
        for i, raw in enumerate(raws):
            try:
                records.append(orjson.loads(raw))
            except orjson.JSONDecodeError as e:
                lenient = _lenient(raw)
                records.append(lenient)
                if lenient is None:
                    errors[i] = "empty: no record in the entry" if not raw else _not_json(raw, e)
        return records, errors

    def parse_batch(self, raws: list[bytes]) -> tuple[list[Any], list[str | None]]:
        """:meth:`parse` for many records: ``(records, reasons)``, checked together."""
        records, errors = self._decode(raws)
        reasons = self.check_batch(records)
        for i, e in errors.items():
            reasons[i] = e
        return records, reasons

    def parse_inputs(
        self, raws: list[bytes]
    ) -> tuple[list[Any], list[str | None], dict[str, np.ndarray]]:
        """:meth:`parse_batch`, and the model's inputs for the records that pass.

        Returns:
            ``(records, reasons, inputs)``: inputs as :meth:`check_parsed` gives them.
        """
        records, errors = self._decode(raws)
        reasons, inputs = self.check_parsed(records)
        for i, e in errors.items():
            reasons[i] = e
        return records, reasons, inputs

    def check_parsed(self, records: list[Any]) -> tuple[list[str | None], dict[str, np.ndarray]]:
        """:meth:`check_batch`, and the model's inputs for the records that pass.

        With the C checker (``_hotpath.check_rows``) the common case is decided and its
        inputs built in one pass; the records it flags go through :meth:`check`, and
        regexes run here. Without it, :meth:`check_batch` then :meth:`columns`.

        Returns:
            Per record its reason or None, and feature → float32 array of the passing
            records, in order.
        """
        if self._hot is None:
            reasons = self.check_batch(records)
            return reasons, self.columns(_passing(records, reasons))
        specs, patterns = self._hot
        flags, features, texts = _hotpath.check_rows(
            records, specs, self._extra_ok, len(self.features), len(patterns)
        )
        for pattern, values in zip(patterns, texts, strict=True):
            if all(map(pattern.search, [v for v in values if v is not None])):
                continue
            for i, v in enumerate(values):
                if v is not None and not flags[i] and not pattern.search(v):
                    flags[i] = 1
        columns = {
            n: np.frombuffer(f, dtype=np.float32)
            for n, f in zip(self.features, features, strict=True)
        }
        if not any(flags):
            return [None] * len(records), columns
        reasons = [self.check(r) if flags[i] else None for i, r in enumerate(records)]
        if any(flags[i] and why is None for i, why in enumerate(reasons)):  # flagged, passes
            return reasons, self.columns(_passing(records, reasons))
        keep = np.frombuffer(flags, dtype=bool) == 0
        return reasons, {n: c[keep] for n, c in columns.items()}

    def columns(self, records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        """The model's raw inputs for checked records: feature → array (batch first).

        Numbers as float32 (NaN where missing), string categories as text (``""`` where
        missing), integer codes as int64: what the exported model takes.
        """
        out: dict[str, np.ndarray] = {}
        n = len(records)
        markers = self.null_values
        for name in self.features:
            dtype = self.spec[name][0]
            if name not in self._missing_ok and dtype == "float32":
                with np.errstate(over="ignore"):  # beyond float32 is inf: the scorer refuses it
                    out[name] = np.fromiter((r[name] for r in records), np.float32, count=n)
                continue
            values = [r.get(name) for r in records]
            missing = [v is None or (type(v) is str and v in markers) for v in values]
            if dtype == "string":
                arr = np.empty(n, dtype=object)
                pairs = zip(values, missing, strict=True)
                arr[:] = [MISSING_CATEGORY if m else v for v, m in pairs]
                out[name] = arr
            elif dtype == "int64":
                out[name] = np.fromiter(values, np.int64, count=n)
            else:
                with np.errstate(over="ignore"):
                    out[name] = np.fromiter(
                        (math.nan if m else v for v, m in zip(values, missing, strict=True)),
                        np.float32,
                        count=n,
                    )
        return out
