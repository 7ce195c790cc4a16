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

from trainyard.contracts import INT_RANGES, MISSING_CATEGORY, Column, Contract, feature_spec
from trainyard.errors import ConfigError

Check = Callable[[Any], str | None]


def _type_check(col: Column) -> Check:
    if col.type == "string":

        def check(v: Any) -> str | None:
            return None if isinstance(v, str) else f"expected a string, got {show_value(v)}"

    elif col.type in ("int32", "int64"):
        lowest, highest = INT_RANGES[col.type]

        def check(v: Any) -> str | None:
            if type(v) is int:  # the common case first (a bool is no int here)
                return (
                    None
                    if lowest <= v <= highest
                    else f"{show_value(v)} is outside the {col.type} range"
                )
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
            if type(v) is float and v - v == 0.0:  # the common case first: finite
                return None
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
        self._missing_ok = {f for f in self.features if contract.feature(f).nullable}
        self._required = [self.key, *(f for f in self.features if f not in self._missing_ok)]
        self._checks: dict[str, tuple[bool, list[Check]]] = {
            c.name: (c.nullable or c.severity_of("nullable") == "warn", _column_checks(c))
            for c in contract.columns
        }
        self._required_keys = frozenset(self._required)
        self._extra_ok = contract.allow_extra_columns

    def check(self, record: Any) -> str | None:
        """The reason ``record`` fails the contract, or None if it passes."""
        if not isinstance(record, dict):
            return f"not a JSON object ({type(record).__name__})"
        if not self._required_keys <= record.keys():
            missing = next(name for name in self._required if name not in record)
            return f"{missing}: missing (the key and every feature are required)"
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
        """:meth:`check` for each record."""
        check = self.check
        return [check(r) for r in records]

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

        Returns:
            Per record its reason or None, and feature → model input array of the passing
            records, in order.
        """
        reasons = self.check_batch(records)
        passing = records if not any(reasons) else _passing(records, reasons)
        return reasons, self.columns(passing)

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
