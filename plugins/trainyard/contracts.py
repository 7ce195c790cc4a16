"""Data contracts (``data_contracts/<dataset>.yaml``): load, check, split, serve.

A contract declares a dataset's source, columns and quality rules, roles, drift limits and
holdout split (the format is documented in ``docs/reference/contracts.md``). Loading checks it
twice: against the JSON schema shipped next to the contracts (structure, types, unknown
fields), then against semantic rules (every rule names an existing column of a fitting
type). Every failure is one ``ContractError`` naming the file, the line and the field.
YAML is loaded with the safe loader only, so tags that construct objects are refused.
"""

from __future__ import annotations

import itertools
import json
import keyword
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from trainyard.errors import ContractError
from trainyard.fsutil import YamlWhere as _Where
from trainyard.fsutil import load_yaml
from trainyard.fsutil import yaml_line_index as _line_index
from trainyard.regexes import (
    ambiguous_alternation,
    nested_repetition,
    usable_regex,
    value_pattern,
)
from trainyard.settings import get_settings

if TYPE_CHECKING:
    import numpy as np

Severity = Literal["error", "warn"]
SCHEMA_FILE = "contract.schema.json"
NUMERIC_TYPES = frozenset({"int32", "int64", "float32", "float64"})
COLUMN_RULES = (
    "nullable",
    "unique",
    "min",
    "max",
    "allowed_values",
    "all_values_present",
    "regex",
    "min_length",
    "max_length",
    "max_null_share",
    "max_unseen_share",
)
DEFAULT_NULL_VALUES = ("",)
"""The null markers of a contract that declares none: an empty cell is null in every type."""
MISSING_CATEGORY = ""
"""What a missing categorical value is inside the exported model (and in its requests)."""
HOLDOUT_BUCKETS = 10_000
#: Largest image (width x height) staging and validation accept: a header may claim
#: 60000 x 60000 pixels, which no decoder should be asked to allocate.
MAX_IMAGE_PIXELS = 1 << 26


@dataclass(frozen=True)
class Source:
    """Where the dataset's raw data comes from (``format`` as in pipeline configs).

    Attributes:
        format: ``csv``, ``parquet``, ``jsonl`` or ``image_folder``.
        extension: The files' extension.
        null_values: The cells that mean "no value" in every column type (always holds
            ``""``), read alike at staging, validation, serving and stream scoring.
    """

    format: str
    extension: str | None = None
    null_values: tuple[str, ...] = DEFAULT_NULL_VALUES


@dataclass(frozen=True)
class ImageSpec:
    """The decoded image feature of a files dataset."""

    column: str
    height: int
    width: int
    channels: int


@dataclass(frozen=True)
class Column:
    """One column of the snapshot's table view and its rules.

    ``severity`` maps each rule the column declares to ``error`` (blocks) or ``warn``.
    """

    name: str
    type: str
    nullable: bool = True
    unique: bool = False
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    allowed_values: tuple[Any, ...] | None = None
    all_values_present: bool = False
    regex: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    max_null_share: float | None = None
    max_unseen_share: float | None = None
    description: str = ""
    severity: dict[str, Severity] = field(default_factory=dict)

    @property
    def numeric(self) -> bool:
        """True for integer and floating point columns."""
        return self.type in NUMERIC_TYPES

    @property
    def value_regex(self) -> str | None:
        """``regex`` as values are searched with (:func:`value_pattern`).

        Validation, the stream scorer and the contract's own check of its allowed values
        all search with this.
        """
        return None if self.regex is None else value_pattern(self.regex)

    def severity_of(self, rule: str) -> Severity:
        """The severity of one of this column's rules (``error`` unless declared ``warn``)."""
        return self.severity.get(rule, "error")


TASKS = ("classification", "regression")
FeatureKind = Literal["numeric", "categorical"]


@dataclass(frozen=True)
class Feature:
    """How the model reads one table feature (``roles.features[]``), typed by the contract.

    The statistics these name (a mean, a learned vocabulary) are computed at training over
    the training split and built into the exported model (``training/worker/transform.py``).

    Attributes:
        name: The column.
        kind: ``numeric`` or ``categorical``.
        column_type: The column's contract type.
        nullable: Whether the column may be null (then a numeric feature has ``impute``).
        impute: ``mean``, ``median``, ``zero`` or a number: what a missing value becomes.
        missing_indicator: Also feed a 0/1 "was missing" input.
        normalize: ``standard``, ``minmax`` or ``none``.
        bucketize: Bucket boundaries (the model sees a one-hot bucket), or None.
        vocabulary: A declared vocabulary (the column's ``allowed_values``), or None.
        top_k: The size of a learned vocabulary.
        min_frequency: A learned token's least count in the training split.
        oov_buckets: Buckets for values outside the vocabulary.
    """

    name: str
    kind: FeatureKind
    column_type: str
    nullable: bool = False
    impute: str | float | None = None
    missing_indicator: bool = False
    normalize: str = "standard"
    bucketize: tuple[float, ...] | None = None
    vocabulary: tuple[Any, ...] | None = None
    top_k: int | None = None
    min_frequency: int = 1
    oov_buckets: int = 1

    @property
    def categorical(self) -> bool:
        """True for a categorical feature (a string or integer-coded column)."""
        return self.kind == "categorical"

    @property
    def dtype(self) -> str:
        """The exported model's input dtype: ``string``, ``int64`` or ``float32``."""
        if not self.categorical:
            return "float32"
        return "string" if self.column_type == "string" else "int64"


@dataclass(frozen=True)
class Roles:
    """Which columns are the key, the label and the model's features, and what is learned.

    Attributes:
        key: The key column.
        label: The label column: class ids ``0..n-1`` for a classifier, a number for a
            regressor.
        features: The model's inputs.
        task: ``classification`` or ``regression``.
        num_classes: A classifier's class count (else from the label's allowed values).
        class_names: A classifier's class names, by class id (served beside the ids).
    """

    key: str
    label: str
    features: list[str]
    task: str = "classification"
    num_classes: int | None = None
    class_names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RowCountRule:
    """Bounds on the number of rows of a whole snapshot."""

    min: int | None = None
    max: int | None = None
    severity: Severity = "error"


@dataclass(frozen=True)
class FreshnessRule:
    """The newest value of ``column`` (or the snapshot's creation) is at most this old."""

    max_age_hours: float
    column: str | None = None
    severity: Severity = "error"


@dataclass(frozen=True)
class DatasetRules:
    """Rules on the whole snapshot rather than on single values."""

    row_count: RowCountRule | None = None
    freshness: FreshnessRule | None = None


@dataclass(frozen=True)
class DriftRule:
    """A limit on how far a column may move against the last validated snapshot."""

    column: str
    method: Literal["psi", "chi2", "ks", "mean_shift", "std_shift"]
    max: float
    bins: int = 10
    severity: Severity = "error"


@dataclass(frozen=True)
class Split:
    """Holdout split by a stable hash of a key column."""

    holdout_fraction: float
    by: str


@dataclass(frozen=True)
class Contract:
    """A parsed, checked data contract."""

    dataset: str
    version: str
    owner: str
    source: Source
    columns: list[Column]
    roles: Roles
    split: Split
    description: str = ""
    image: ImageSpec | None = None
    allow_extra_columns: bool = False
    rules: DatasetRules = DatasetRules()
    drift: list[DriftRule] = field(default_factory=list)
    features: dict[str, Feature] = field(default_factory=dict)
    path: Path | None = None

    def feature(self, name: str) -> Feature:
        """The table feature called ``name`` (``roles.features``; not an image).

        Raises:
            ContractError: If no table feature has that name.
        """
        try:
            return self.features[name]
        except KeyError:
            raise ContractError(f"{self.path or self.dataset}: no table feature {name!r}") from None

    @property
    def is_regression(self) -> bool:
        """Whether the model learns a number (``roles.task: regression``)."""
        return self.roles.task == "regression"

    def num_classes(self) -> int:
        """A classifier's class count: ``roles.num_classes``, else the label's allowed values.

        Raises:
            ContractError: For a regression contract (it has no classes).
        """
        if self.is_regression:
            raise ContractError(f"{self.dataset}: a regression contract has no classes")
        if self.roles.num_classes is not None:
            return self.roles.num_classes
        allowed = self.column(self.roles.label).allowed_values
        assert allowed is not None, "checked when the contract was parsed"
        return len(allowed)

    def class_names(self, found: Sequence[str] | None = None) -> list[str]:
        """A classifier's class names by id.

        ``roles.class_names``, else ``found`` (the class folders staging numbered), else the
        ids as text.
        """
        n = self.num_classes()
        if self.roles.class_names:
            return list(self.roles.class_names)
        if found and len(found) == n:
            return [str(c) for c in found]
        return [str(i) for i in range(n)]

    def column(self, name: str) -> Column:
        """The column called ``name``.

        Raises:
            ContractError: If the contract has no such column.
        """
        for col in self.columns:
            if col.name == name:
                return col
        raise ContractError(f"{self.path or self.dataset}: no column {name!r}")

    @property
    def column_names(self) -> list[str]:
        """Column names in contract order."""
        return [c.name for c in self.columns]


def schema_path() -> Path:
    """The JSON schema every contract must satisfy (shipped in the contracts folder).

    The checkout's when trainyard runs from it (``plugins/``), else the project folder's
    (``TRAINYARD_PROJECT_DIR``): the images install trainyard as a wheel in site-packages
    and bake ``data_contracts/`` into the project folder.
    """
    checkout = Path(__file__).resolve().parents[2] / "data_contracts" / SCHEMA_FILE
    if checkout.is_file():
        return checkout
    return get_settings().project_dir / "data_contracts" / SCHEMA_FILE


@lru_cache(maxsize=1)
def _schema_validator() -> Any:
    import jsonschema

    path = schema_path()
    schema = json.loads(path.read_text(encoding="utf-8"))
    # the shipped schema itself is checked against its meta-schema by the tests
    return jsonschema.validators.validator_for(schema)(schema)


def _schema_errors(raw: Any, where: _Where) -> list[str]:
    return _describe_schema_errors(_schema_validator().iter_errors(raw), where)


def _describe_schema_errors(errors: Any, where: _Where) -> list[str]:
    """One line per schema error; of a ``oneOf``, the errors of the branch of the value's type.

    A feature given as an object that breaks the object form is reported as that form's
    errors (``roles.features[0].scale: unknown field``), not as "is not a string".
    """
    out = []
    for err in sorted(errors, key=lambda e: (list(e.absolute_path), e.message)):
        message = err.message
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = err.schema.get("properties", {})
            for key in sorted(k for k in err.instance if k not in allowed):
                out.append(where([*err.absolute_path, key], f"unknown field {key!r}"))
            continue
        if err.validator == "oneOf" and err.context:
            fitting = [c for c in err.context if c.validator != "type"]
            if fitting:
                out += _describe_schema_errors(fitting, where)
                continue
            message = "; ".join(sorted({c.message for c in err.context}))
        out.append(where(list(err.absolute_path), message))
    return out


INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
"""The values an integer column holds."""


def _value_fits(value: Any, type_: str) -> bool:
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "bool":
        return isinstance(value, bool)
    if type_ in INT_RANGES:
        lowest, highest = INT_RANGES[type_]
        return isinstance(value, int) and not isinstance(value, bool) and lowest <= value <= highest
    if type_ in ("float32", "float64"):
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    return False


def _empty_range(col: dict[str, Any], type_: str, at: list[Any], where: _Where) -> list[str]:
    """The error when no value (no integer, for an integer column) lies within the bounds."""
    lo, hi = col.get("min"), col.get("max")
    if not (_value_fits(lo, "float64") and _value_fits(hi, "float64")):
        return []
    lo_ex, hi_ex = col.get("min_exclusive", False), col.get("max_exclusive", False)
    if lo > hi:
        return [where([*at, "min"], f"min {lo} is greater than max {hi}")]
    if type_ in INT_RANGES:
        first = math.floor(lo) + 1 if lo_ex else math.ceil(lo)
        last = math.ceil(hi) - 1 if hi_ex else math.floor(hi)
        empty = first > last
    else:
        empty = lo == hi and (lo_ex or hi_ex)
    if empty:
        kind = "integer" if type_ in INT_RANGES else "value"
        return [where([*at, "min"], f"no {kind} lies between min {lo} and max {hi} as given")]
    return []


def _breaks_rules(value: Any, col: dict[str, Any]) -> str | None:
    """Why an allowed value fails the column's own bounds, lengths or regex, or None."""
    if isinstance(value, str):
        if "min_length" in col and len(value) < col["min_length"]:
            return f"is shorter than min_length {col['min_length']}"
        if "max_length" in col and len(value) > col["max_length"]:
            return f"is longer than max_length {col['max_length']}"
        pattern = usable_regex(col["regex"]) if "regex" in col else None
        if pattern is not None and not pattern.search(value):  # a bad regex is its own error
            return f"does not match the regex {col['regex']!r}"
        return None
    if isinstance(value, bool):
        return None
    lo, hi = col.get("min"), col.get("max")
    if lo is not None and (value <= lo if col.get("min_exclusive") else value < lo):
        return f"is below min {lo}"
    if hi is not None and (value >= hi if col.get("max_exclusive") else value > hi):
        return f"is above max {hi}"
    return None


def _semantic_errors(raw: dict[str, Any], where: _Where, stem: str | None) -> list[str]:
    errs: list[str] = []
    if stem is not None and raw["dataset"] != stem:
        errs.append(where(["dataset"], f"{raw['dataset']!r} must equal the file name {stem!r}"))
    types: dict[str, str] = {}
    for i, col in enumerate(raw["columns"]):
        name, type_ = col["name"], col["type"]
        at = ["columns", i]
        if name in types:
            errs.append(where([*at, "name"], f"duplicate column {name!r}"))
        types[name] = type_
        for rule in ("min", "max"):
            if rule in col and type_ not in NUMERIC_TYPES:
                errs.append(
                    where([*at, rule], f"{rule} needs a numeric column, {name!r} is {type_}")
                )
        for flag, rule in (("min_exclusive", "min"), ("max_exclusive", "max")):
            if flag in col and rule not in col:
                errs.append(where([*at, flag], f"{flag} needs {rule}"))
        for rule in ("min", "max"):
            if rule in col and not _value_fits(col[rule], "float64"):
                errs.append(
                    where([*at, rule], f"{rule} must be a finite number, got {col[rule]!r}")
                )
        errs += _empty_range(col, type_, at, where)
        for rule in ("regex", "min_length", "max_length"):
            if rule in col and type_ != "string":
                errs.append(
                    where([*at, rule], f"{rule} needs a string column, {name!r} is {type_}")
                )
        if col.get("min_length", 0) > col.get("max_length", float("inf")):
            errs.append(where([*at, "min_length"], "min_length is greater than max_length"))
        if "regex" in col:
            try:
                re.compile(col["regex"])
                nested = nested_repetition(col["regex"])
                ambiguous = ambiguous_alternation(col["regex"])
            except (re.error, OverflowError) as e:
                errs.append(where([*at, "regex"], f"invalid regular expression: {e}"))
            except RecursionError:
                errs.append(where([*at, "regex"], "invalid regular expression: nested too deep"))
            else:
                if nested:
                    errs.append(
                        where(
                            [*at, "regex"],
                            "a repeated group holds a repeat that can split a value between "
                            "its rounds in many ways: a value that almost matches can take "
                            "exponential time; end (or start) each round with a character "
                            "nothing else in it matches ((\\d{1,3}\\.){3}, (\\s+\\w+)*), or "
                            "make the inner repeat possessive (a++) where nothing after it "
                            "needs characters back",
                        )
                    )
                elif ambiguous:
                    errs.append(
                        where(
                            [*at, "regex"],
                            "a repeated group holds alternatives that can start with the "
                            "same character, or can match nothing ((a?){9}): a value that "
                            "almost matches can take exponential time; let the alternatives "
                            "start differently ((a|ab)+ as (ab?)+), or make the repeat "
                            "possessive ((a|ab)++) where nothing after it needs characters back",
                        )
                    )
        for j, value in enumerate(col.get("allowed_values", [])):
            if not _value_fits(value, type_):
                errs.append(where([*at, "allowed_values", j], f"{value!r} is not a {type_} value"))
            elif (why := _breaks_rules(value, col)) is not None:
                errs.append(where([*at, "allowed_values", j], f"{value!r} {why}"))
        if col.get("all_values_present") and "allowed_values" not in col:
            errs.append(where([*at, "all_values_present"], "needs allowed_values"))
        if col.get("unique") and type_ in ("float32", "float64"):
            errs.append(where([*at, "unique"], "unique is not supported on float columns"))
        severity = col.get("severity")
        if isinstance(severity, dict):
            for rule in severity:
                declared = (col.get(rule) is not None and col.get(rule) is not False) or (
                    rule == "nullable" and col.get("nullable") is False
                )
                if not declared:
                    errs.append(where([*at, "severity", rule], f"column declares no {rule} rule"))

    def need_column(keys: list[Any], name: str, *, numeric: bool = False) -> None:
        if name not in types:
            errs.append(where(keys, f"unknown column {name!r} (columns: {', '.join(types)})"))
        elif numeric and types[name] not in NUMERIC_TYPES | {"bool"}:
            errs.append(where(keys, f"column {name!r} is {types[name]}, not numeric"))

    roles = raw["roles"]
    image = raw.get("image")
    if image is not None and image["column"] in types:
        errs.append(where(["image", "column"], "the image is decoded, not a table column"))
    need_column(["roles", "key"], roles["key"])
    need_column(["roles", "label"], roles["label"])
    null_values = raw["source"].get("null_values", list(DEFAULT_NULL_VALUES))
    if "" not in null_values:
        errs.append(
            where(
                ["source", "null_values"],
                'must hold "" (the empty cell): an empty cell is null in every column type, '
                "and the exported model reads an empty string as a missing category",
            )
        )
    features = feature_names(roles["features"])
    by_name = {c["name"]: c for c in raw["columns"]}
    listed: set[str] = set()
    for i, (feature, item) in enumerate(zip(features, roles["features"], strict=True)):
        at = ["roles", "features", i] + ([] if isinstance(item, str) else ["name"])
        if feature in listed:
            errs.append(where(at, f"feature {feature!r} is listed twice"))
            continue
        listed.add(feature)
        if image is not None and feature == image["column"]:
            if isinstance(item, dict) and len(item) > 1:
                errs.append(where(at, "the image feature takes no preprocessing fields"))
            continue
        need_column(at, feature)
        if feature in (roles["key"], roles["label"]):
            errs.append(where(at, f"{feature!r} is also the key or label"))
        if keyword.iskeyword(feature) or feature.startswith("__"):
            # each feature names an argument of the SavedModel's serving signature
            errs.append(
                where(
                    at,
                    f"{feature!r} cannot name an input of the exported model (a Python "
                    "keyword, or a name starting with __): rename the column",
                )
            )
        if feature in by_name:
            errs += _feature_errors(item, by_name[feature], ["roles", "features", i], where)
    for i, col in enumerate(raw["columns"]):
        at = ["columns", i]
        nullable = col.get("nullable", col["name"] not in (*features, roles["label"]))
        if "max_null_share" in col and not nullable:
            errs.append(
                where(
                    [*at, "max_null_share"],
                    f"max_null_share needs nullable: true (column {col['name']!r} holds no nulls)",
                )
            )
        if "max_unseen_share" in col and col["type"] not in ("string", "int32", "int64"):
            errs.append(
                where(
                    [*at, "max_unseen_share"],
                    f"max_unseen_share needs a string or integer column, {col['name']!r} is "
                    f"{col['type']}",
                )
            )
        if col["type"] == "string":
            for j, value in enumerate(col.get("allowed_values", [])):
                if value in null_values:
                    errs.append(
                        where(
                            [*at, "allowed_values", j],
                            f"{value!r} is a null marker (source.null_values): it is read as "
                            "null, never as a value",
                        )
                    )
    label = next((c for c in raw["columns"] if c["name"] == roles["label"]), None)
    if roles.get("task", "classification") == "regression":
        errs += _regression_errors(raw, label, where)
    else:
        errs += _classification_errors(raw, label, where)
    need_column(["split", "by"], raw["split"]["by"])
    for keys, name in ((["roles", "key"], roles["key"]), (["split", "by"], raw["split"]["by"])):
        if types.get(name, "string") != "string":
            errs.append(
                where(
                    keys,
                    f"key column {name!r} is {types[name]}; keys are hashed as text, so it "
                    "must be a string column (declare type: string and staging casts the "
                    "source's values to text)",
                )
            )
    rules = raw.get("rules", {})
    count = rules.get("row_count", {})
    if count.get("min", 0) > count.get("max", float("inf")):
        errs.append(where(["rules", "row_count", "min"], "min is greater than max"))
    fresh = rules.get("freshness", {})
    if "column" in fresh:
        need_column(["rules", "freshness", "column"], fresh["column"])
        if types.get(fresh["column"], "timestamp") != "timestamp":
            errs.append(where(["rules", "freshness", "column"], "needs a timestamp column"))
    for i, rule in enumerate(raw.get("drift", [])):
        need_column(
            ["drift", i, "column"], rule["column"], numeric=rule["method"] not in ("psi", "chi2")
        )
        if rule["method"] == "chi2" and types.get(rule["column"]) in ("float32", "float64"):
            errs.append(
                where(
                    ["drift", i, "method"],
                    f"chi2 compares category counts; column {rule['column']!r} is "
                    f"{types[rule['column']]} (use psi, ks, mean_shift or std_shift)",
                )
            )
    return errs


NUMERIC_FEATURE_FIELDS = ("impute", "missing_indicator", "normalize", "bucketize")
CATEGORICAL_FEATURE_FIELDS = ("top_k", "min_frequency", "oov_buckets")


def feature_names(items: Sequence[Any]) -> list[str]:
    """The column names of ``roles.features`` entries (a name, or an object with ``name``)."""
    return [item if isinstance(item, str) else item["name"] for item in items]


def _may_be_null(col: dict[str, Any]) -> bool:
    """Whether a feature column's nulls can pass validation (nullable, or a warn-only rule)."""
    severity = col.get("severity")
    warn = severity == "warn" or (isinstance(severity, dict) and severity.get("nullable") == "warn")
    return col.get("nullable") is True or warn


def _feature_errors(item: Any, col: dict[str, Any], at: list[Any], where: _Where) -> list[str]:
    """What makes one ``roles.features`` entry untrainable, at its line.

    A string column is categorical, a numeric or bool column numeric; a nullable numeric
    feature needs ``impute``; a categorical one needs a vocabulary (declared by
    ``allowed_values`` or learned with ``top_k``).
    """
    spec: dict[str, Any] = {} if isinstance(item, str) else item
    name, type_ = col["name"], col["type"]

    def here(key: str | None = None) -> list[Any]:
        """Where to point: the entry's field ``key`` (its name by default), or the entry."""
        return [*at, key or "name"] if spec else at

    errs: list[str] = []
    if type_ == "timestamp":
        return [
            where(
                here(),
                f"feature {name!r} is a timestamp column: the model takes numbers and "
                "categories (derive one from it in the source)",
            )
        ]
    kind = spec.get("kind", "categorical" if type_ == "string" else "numeric")
    if kind == "numeric" and type_ == "string":
        return [where(here("kind"), f"{name!r} is a string column: a categorical feature")]
    if kind == "categorical" and type_ not in ("string", "int32", "int64"):
        return [
            where(
                here("kind"),
                f"{name!r} is a {type_} column: categories are strings or integer codes "
                "(bucketize a number instead)",
            )
        ]
    wrong = CATEGORICAL_FEATURE_FIELDS if kind == "numeric" else NUMERIC_FEATURE_FIELDS
    other = "categorical" if kind == "numeric" else "numeric"
    for key in (k for k in wrong if k in spec):
        errs.append(where(here(key), f"{key} applies to {other} features; {name!r} is {kind}"))
    if errs:
        return errs
    nullable = _may_be_null(col)
    if kind == "numeric":
        impute = spec.get("impute")
        if nullable and impute is None:
            errs.append(
                where(
                    here(),
                    f"feature {name!r} may be null (its column is nullable): declare impute "
                    "(mean | median | zero | a number) so the model fills it, or make the "
                    "column nullable: false",
                )
            )
        if spec.get("missing_indicator") and impute is None:
            errs.append(where(here("missing_indicator"), "missing_indicator needs impute"))
        if isinstance(impute, int | float) and not isinstance(impute, bool):
            if not math.isfinite(impute):
                errs.append(where(here("impute"), f"impute must be finite, got {impute!r}"))
            elif (why := _breaks_rules(impute, col)) is not None:
                errs.append(where(here("impute"), f"impute value {impute!r} {why}"))
        edges = spec.get("bucketize")
        if edges is not None:
            if spec.get("normalize", "none") != "none":
                errs.append(
                    where(
                        here("normalize"),
                        "bucketize replaces the number by its bucket: there is nothing to "
                        "normalize (drop normalize)",
                    )
                )
            finite = all(_value_fits(e, "float64") for e in edges)
            if not finite or any(b <= a for a, b in itertools.pairwise(edges)):
                errs.append(
                    where(
                        here("bucketize"),
                        f"bucket boundaries must be finite and strictly increasing, got {edges}",
                    )
                )
        return errs
    if nullable and type_ != "string":
        errs.append(
            where(
                here(),
                f"integer-coded categorical feature {name!r} may be null, and its int64 model "
                "input has no null: declare the column type: string (then missing is a "
                "category of its own), or nullable: false",
            )
        )
    declared = col.get("allowed_values")
    if declared is not None:
        learned = [k for k in ("top_k", "min_frequency") if k in spec]
        if learned:
            errs.append(
                where(
                    here(learned[0]),
                    f"the vocabulary of {name!r} is declared (its allowed_values); top_k and "
                    "min_frequency learn one from the data: drop them",
                )
            )
    elif "top_k" not in spec:
        errs.append(
            where(
                here(),
                f"categorical feature {name!r} needs a vocabulary: allowed_values on its "
                "column, or top_k to learn the most frequent values of the training split",
            )
        )
    return errs


def _classification_errors(
    raw: dict[str, Any], label: dict[str, Any] | None, where: _Where
) -> list[str]:
    """A classifier's label: integer class ids ``0..n-1``, n from the contract."""
    roles = raw["roles"]
    num_classes = roles.get("num_classes")
    names = roles.get("class_names")
    errs: list[str] = []
    if label is None:
        return errs
    allowed = label.get("allowed_values")
    if label["type"] not in ("int32", "int64"):
        errs.append(
            where(
                ["roles", "label"],
                f"a classification label must be an integer column (class ids), "
                f"{label['name']!r} is {label['type']}"
                + (
                    "; a numeric target needs roles.task: regression"
                    if label["type"] in NUMERIC_TYPES
                    else ""
                ),
            )
        )
        return errs
    if num_classes is None and allowed is None:
        errs.append(
            where(
                ["roles"],
                f"a classifier needs its class count: roles.num_classes, or allowed_values "
                f"on the label {label['name']!r} (it is not guessed from the data)",
            )
        )
        return errs
    if num_classes is not None and allowed is not None and len(allowed) != num_classes:
        errs.append(
            where(
                ["roles", "num_classes"],
                f"{num_classes} classes but label {label['name']!r} allows {len(allowed)} values",
            )
        )
    n = num_classes if num_classes is not None else len(allowed)
    ids = [v for v in allowed or [] if isinstance(v, int) and not isinstance(v, bool)]
    if allowed is not None and len(ids) == len(allowed) and sorted(ids) != list(range(len(ids))):
        errs.append(
            where(
                ["columns", raw["columns"].index(label), "allowed_values"],
                f"class ids of label {label['name']!r} must be 0..{len(allowed) - 1}, "
                f"got {allowed}",
            )
        )
    if names is not None and len(names) != n:
        errs.append(where(["roles", "class_names"], f"{len(names)} class names for {n} classes"))
    return errs


def _regression_errors(
    raw: dict[str, Any], label: dict[str, Any] | None, where: _Where
) -> list[str]:
    """A regressor's label: one numeric column, a table source, no classes."""
    roles = raw["roles"]
    errs = [
        where(["roles", key], f"a regression contract has no {key}")
        for key in ("num_classes", "class_names")
        if key in roles
    ]
    if "image" in raw:
        errs.append(
            where(
                ["roles", "task"],
                "regression needs a table source: image labels are class folders",
            )
        )
    if label is not None and label["type"] not in NUMERIC_TYPES:
        errs.append(
            where(
                ["roles", "label"],
                f"a regression target must be a numeric column, {label['name']!r} is "
                f"{label['type']}",
            )
        )
    return errs


def _role_rules(col: dict[str, Any], roles: dict[str, Any]) -> dict[str, Any]:
    """A label or feature column with the rules its role implies, checked by validation.

    The label is non-null, and so is a feature whose column says nothing about nulls (a
    nullable feature must say how the model fills it); a classifier's label takes only
    its class ids (``allowed_values: 0..n-1`` when the contract gives ``num_classes``
    alone), so a row outside the class count rejects the snapshot instead of failing
    training.
    """
    if col["name"] in feature_names(roles["features"]) and "nullable" not in col:
        return {**col, "nullable": False}
    if col["name"] != roles["label"]:
        return col
    col = {**col, "nullable": False}
    task = roles.get("task", "classification")
    if task == "classification" and "allowed_values" not in col and roles.get("num_classes"):
        col["allowed_values"] = list(range(roles["num_classes"]))
    return col


def _severity_map(col: dict[str, Any]) -> dict[str, Severity]:
    sev = col.get("severity", "error")
    if isinstance(sev, str):
        return dict.fromkeys(COLUMN_RULES, sev)  # type: ignore[arg-type]
    return dict(sev)


def _features(raw: dict[str, Any], columns: Sequence[Column]) -> dict[str, Feature]:
    """The table features of a checked contract, typed (the image feature is none)."""
    by_name = {c.name: c for c in columns}
    out: dict[str, Feature] = {}
    for item in raw["roles"]["features"]:
        spec = {"name": item} if isinstance(item, str) else dict(item)
        col = by_name.get(spec["name"])
        if col is None:  # the image feature
            continue
        kind = spec.pop("kind", "categorical" if col.type == "string" else "numeric")
        edges = spec.pop("bucketize", None)
        out[col.name] = Feature(
            **spec,
            kind=kind,
            column_type=col.type,
            nullable=col.nullable or col.severity_of("nullable") == "warn",
            bucketize=tuple(float(e) for e in edges) if edges is not None else None,
            vocabulary=col.allowed_values if kind == "categorical" else None,
        )
    return out


def _build(raw: dict[str, Any], path: Path | None) -> Contract:
    rules = raw.get("rules", {})
    columns = [
        Column(
            **{k: v for k, v in c.items() if k not in ("allowed_values", "severity")},
            allowed_values=tuple(c["allowed_values"]) if "allowed_values" in c else None,
            severity=_severity_map(c),
        )
        for c in (_role_rules(col, raw["roles"]) for col in raw["columns"])
    ]
    source = dict(raw["source"])
    if "null_values" in source:
        source["null_values"] = tuple(source["null_values"])
    return Contract(
        dataset=raw["dataset"],
        version=raw["version"],
        owner=raw["owner"],
        description=raw.get("description", ""),
        source=Source(**source),
        image=ImageSpec(**raw["image"]) if "image" in raw else None,
        allow_extra_columns=raw.get("allow_extra_columns", False),
        columns=columns,
        roles=Roles(
            **{k: v for k, v in raw["roles"].items() if k not in ("class_names", "features")},
            features=feature_names(raw["roles"]["features"]),
            class_names=tuple(raw["roles"]["class_names"])
            if "class_names" in raw["roles"]
            else None,
        ),
        rules=DatasetRules(
            row_count=RowCountRule(**rules["row_count"]) if "row_count" in rules else None,
            freshness=FreshnessRule(**rules["freshness"]) if "freshness" in rules else None,
        ),
        drift=[DriftRule(**d) for d in raw.get("drift", [])],
        split=Split(**raw["split"]),
        features=_features(raw, columns),
        path=path,
    )


def parse_contract_text(text: str, path: Path, *, check_name: bool = True) -> Contract:
    """Parse and check a contract from its YAML text.

    Args:
        text: The YAML document.
        path: The file it came from (named in errors; its stem must equal ``dataset``).
        check_name: Whether ``dataset`` must equal the file's stem.

    Returns:
        The checked contract.

    Raises:
        ContractError: If the YAML is invalid or unsafe, breaks the JSON schema, or breaks
            a semantic rule; the message names the file, line and field of every problem.
    """
    try:
        raw = load_yaml(text, path)
        lines, duplicates = _line_index(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ContractError(f"{path}{line}: not valid (safe) YAML: {e.problem or e}") from e
    except yaml.YAMLError as e:
        raise ContractError(f"{path}: not valid YAML: {e}") from e
    where = _Where(path, lines)
    if not isinstance(raw, dict):
        raise ContractError(where([], "expected a mapping at the top level"))
    if duplicates:
        found = [where(keys, "duplicate key") for keys in duplicates]
        raise ContractError(f"{path}: invalid data contract\n  " + "\n  ".join(found))
    errors = _schema_errors(raw, where)
    if not errors:
        errors = _semantic_errors(raw, where, path.stem if check_name else None)
    if errors:
        raise ContractError(f"{path}: invalid data contract\n  " + "\n  ".join(errors))
    return _build(raw, path)


def parse_contract(path: Path) -> Contract:
    """Load and check one contract file.

    Args:
        path: The YAML file.

    Returns:
        The checked contract.

    Raises:
        ContractError: If the file is missing or invalid (names file, line and field).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ContractError(f"{path}: data contract not found") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ContractError(f"{path}: cannot read data contract: {e}") from e
    return parse_contract_text(text, path)


def contract_files(contracts_dir: Path | None = None) -> list[Path]:
    """Every contract file of the project, sorted."""
    folder = contracts_dir or get_settings().contracts_dir
    return sorted(folder.glob("*.yaml"))


def load_contract(dataset: str) -> Contract:
    """Load the contract of a dataset from ``<contracts_dir>/<dataset>.yaml``.

    Args:
        dataset: The dataset name.

    Returns:
        The checked contract.

    Raises:
        ContractError: If there is no such contract (lists the known ones) or it is invalid.
    """
    if not re.match(r"^[a-z][a-z0-9_]{0,62}$", dataset):
        raise ContractError(f"invalid dataset name {dataset!r}")
    folder = get_settings().contracts_dir
    path = folder / f"{dataset}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in contract_files(folder)) or "none"
        raise ContractError(f"no data contract for {dataset!r} (known: {known}; in {folder})")
    return parse_contract(path)


def holdout_mask(keys: Sequence[str], fraction: float) -> np.ndarray:
    """Stable holdout membership of each key; the split never moves between runs.

    Args:
        keys: Key values (``roles.key`` / ``split.by`` of the contract).
        fraction: Holdout fraction in (0, 1).

    Returns:
        A boolean array, True where the key belongs to the holdout set.

    Raises:
        ContractError: If a key is not a string (names the value).
    """
    import numpy as np
    import xxhash

    cut = round(fraction * HOLDOUT_BUCKETS)
    try:
        return np.fromiter(
            (xxhash.xxh3_64_intdigest(k.encode()) % HOLDOUT_BUCKETS < cut for k in keys),
            dtype=bool,
            count=len(keys),
        )
    except AttributeError:
        bad = next(k for k in keys if not isinstance(k, str))
        raise ContractError(
            f"holdout split: key {bad!r} is a {type(bad).__name__}, not a string (the "
            "contract's key column must be a non-null string column)"
        ) from None


def feature_spec(contract: Contract) -> dict[str, tuple[str, tuple[int | None, ...] | None]]:
    """The serving inputs of a contract's model: name → (dtype, shape incl. batch dim).

    Args:
        contract: The dataset's contract.

    Returns:
        ``{"image": ("float32", (None, H, W, C))}`` for an image dataset, else one entry
        per feature column, in contract order: ``("float32", (None,))`` for a numeric
        feature (missing: NaN), ``("string", (None,))`` for a string categorical (raw
        values; missing: ``""``), ``("int64", (None,))`` for an integer-coded one.
    """
    spec: dict[str, tuple[str, tuple[int | None, ...]]] = {}
    for name in contract.roles.features:
        img = contract.image
        if img is not None and name == img.column:
            spec[name] = ("float32", (None, img.height, img.width, img.channels))
        else:
            spec[name] = (contract.feature(name).dtype, (None,))
    return spec
