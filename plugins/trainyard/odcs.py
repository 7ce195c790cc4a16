"""Data contracts to and from the Open Data Contract Standard (ODCS v3.2.0).

``python -m trainyard contracts export --format odcs`` and ``contracts import`` translate
``data_contracts/<dataset>.yaml``. What ODCS says natively is said natively: one schema
object (the dataset's table) whose properties are the columns (``logicalType`` and the
contract's type as ``physicalType``, ``required`` for a stated nullability, ``unique``,
``primaryKey`` for the key, ``logicalTypeOptions`` for bounds, ``pattern`` and lengths,
``enum`` for allowed values), the row-count rule as a ``rowCount`` quality check, the
owner as a team member, the description as its purpose. What only trainyard knows (the
ML roles, the holdout split, drift rules, the source format and null markers, images,
per-rule severities, ``all_values_present``, null and unseen shares, freshness, extra
columns) goes under ``customProperties`` with ``vendor: trainyard``. Export then import
gives the same contract; an exported file is checked against ODCS's own JSON schema
(shipped by the ``open-data-contract-standard`` package), and so is every file imported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

from trainyard.errors import ContractError

API_VERSION = "v3.2.0"
VENDOR = "trainyard"
LOGICAL = {
    "string": "string",
    "int32": "integer",
    "int64": "integer",
    "float32": "number",
    "float64": "number",
    "bool": "boolean",
    "timestamp": "timestamp",
}
"""Contract column type → ODCS logical type (the type itself is the physical type)."""
_STRING_OPTIONS = {"regex": "pattern", "min_length": "minLength", "max_length": "maxLength"}
_SEVERITY = {"error": "error", "warn": "warning"}


@cache
def odcs_schema() -> dict[str, Any]:
    """ODCS's JSON schema, as the ``open-data-contract-standard`` package ships it."""
    from importlib.resources import files

    return json.loads((files("open_data_contract_standard") / "schema.json").read_text())


def check_odcs(doc: Mapping[str, Any], where: str) -> None:
    """Check a document against ODCS's JSON schema.

    Raises:
        ContractError: With every problem, each at its JSON path.
    """
    import jsonschema

    schema = odcs_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = sorted(validator.iter_errors(dict(doc)), key=lambda e: list(e.absolute_path))
    if problems:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in problems]
        raise ContractError(
            f"{where}: not a valid ODCS {API_VERSION} contract\n  " + "\n  ".join(lines[:20])
        )


def _custom(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"property": k, "value": v, "vendor": VENDOR} for k, v in values.items()]


def _customs(block: Mapping[str, Any]) -> dict[str, Any]:
    return {
        c["property"]: c["value"]
        for c in block.get("customProperties") or []
        if c.get("vendor") == VENDOR
    }


def _property(col: Mapping[str, Any], key: str) -> dict[str, Any]:
    prop: dict[str, Any] = {
        "name": col["name"],
        "logicalType": LOGICAL[col["type"]],
        "physicalType": col["type"],
    }
    if col.get("description"):
        prop["description"] = col["description"]
    if col["name"] == key:
        prop["primaryKey"], prop["primaryKeyPosition"] = True, 1
    if "nullable" in col:  # stated (a feature unstated is non-null, a nullable one says so)
        prop["required"] = not col["nullable"]
    if col.get("unique"):
        prop["unique"] = True
    options: dict[str, Any] = {}
    for bound, word in (("min", "minimum"), ("max", "maximum")):
        if col.get(bound) is not None:
            exclusive = col.get(f"{bound}_exclusive", False)
            options[f"exclusive{word.title()}" if exclusive else word] = col[bound]
    for rule, word in _STRING_OPTIONS.items():
        if col.get(rule) is not None:
            options[word] = col[rule]
    if options:
        prop["logicalTypeOptions"] = options
    if col.get("allowed_values") is not None:
        prop["enum"] = [{"value": v} for v in col["allowed_values"]]
    custom = {k: col[k] for k in ("all_values_present", "severity") if col.get(k)}
    custom.update(
        {k: col[k] for k in ("max_null_share", "max_unseen_share") if col.get(k) is not None}
    )
    if custom:
        prop["customProperties"] = _custom(custom)
    return prop


def to_odcs(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ODCS document of a contract (its YAML as parsed, already checked).

    Args:
        raw: The contract file's content.

    Returns:
        An ODCS v3.2.0 ``DataContract``.
    """
    roles = raw["roles"]
    table: dict[str, Any] = {
        "name": raw["dataset"],
        "logicalType": "object",
        "physicalType": "table",
        "properties": [_property(c, roles["key"]) for c in raw["columns"]],
    }
    rules = dict(raw.get("rules") or {})
    rows = rules.pop("row_count", None)
    if rows:
        lo, hi = rows.get("min"), rows.get("max")
        check: dict[str, Any] = {"metric": "rowCount", "type": "library"}
        if lo is not None and hi is not None:
            check["mustBeBetween"] = [lo, hi]
        elif lo is not None:
            check["mustBeGreaterOrEqualTo"] = lo
        else:
            check["mustBeLessOrEqualTo"] = hi
        check["severity"] = _SEVERITY[rows.get("severity", "error")]
        table["quality"] = [check]
    ml = {
        "roles": roles,
        "split": raw["split"],
        "source": raw["source"],
        **{k: raw[k] for k in ("image", "drift", "allow_extra_columns") if k in raw},
        **({"rules": rules} if rules else {}),
    }
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "DataContract",
        "id": f"trainyard:{raw['dataset']}",
        "name": raw["dataset"],
        "version": str(raw["version"]),
        "status": "active",
        "team": {"members": [{"username": raw["owner"], "role": "owner"}]},
        "schema": [table],
        "customProperties": _custom(ml),
    }
    if raw.get("description"):
        doc["description"] = {"purpose": raw["description"]}
    return doc


def _column(prop: Mapping[str, Any], where: str) -> dict[str, Any]:
    physical = prop.get("physicalType")
    if physical not in LOGICAL:
        guess = {"integer": "int64", "number": "float64"}.get(prop.get("logicalType", ""))
        physical = guess or next(
            (t for t, lt in LOGICAL.items() if lt == prop.get("logicalType")), None
        )
    if physical is None:
        raise ContractError(
            f"{where}: property {prop.get('name')!r}: logicalType "
            f"{prop.get('logicalType')!r} has no trainyard column type "
            f"({', '.join(sorted(set(LOGICAL.values())))})"
        )
    col: dict[str, Any] = {"name": prop["name"], "type": physical}
    if "required" in prop:
        col["nullable"] = not prop["required"]
    if prop.get("unique"):
        col["unique"] = True
    options = prop.get("logicalTypeOptions") or {}
    for bound, word in (("min", "minimum"), ("max", "maximum")):
        exclusive = f"exclusive{word.title()}"
        if exclusive in options:
            col[bound], col[f"{bound}_exclusive"] = options[exclusive], True
        elif word in options:
            col[bound] = options[word]
    for rule, word in _STRING_OPTIONS.items():
        if word in options:
            col[rule] = options[word]
    if prop.get("enum"):
        col["allowed_values"] = [e["value"] for e in prop["enum"]]
    col.update(_customs(prop))
    if prop.get("description"):
        col["description"] = prop["description"]
    return col


def from_odcs(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A contract (its YAML content) from an ODCS document.

    Args:
        doc: The ODCS document (checked against ODCS's schema here).
        where: Its file, named in errors.

    Returns:
        The contract's content, to be checked by the contract parser.

    Raises:
        ContractError: For a document ODCS's schema refuses, or one that does not say
            what a trainyard contract needs (one schema object; the ML roles and split,
            which only a trainyard export carries, or a primary key to start from).
    """
    check_odcs(doc, where)
    tables = doc.get("schema") or []
    if len(tables) != 1:
        raise ContractError(
            f"{where}: a trainyard contract describes one table; this ODCS contract has "
            f"{len(tables)} schema objects"
        )
    table = tables[0]
    ml = _customs(doc)
    missing = [k for k in ("roles", "split", "source") if k not in ml]
    if missing:
        raise ContractError(
            f"{where}: no trainyard {', '.join(missing)} (customProperties with vendor "
            f"{VENDOR!r}, as 'contracts export --format odcs' writes them): a trainyard "
            "contract needs the label and features, the holdout split and the source format"
        )
    owners = [m for m in (doc.get("team") or {}).get("members") or [] if m.get("role") == "owner"]
    raw: dict[str, Any] = {
        "dataset": table["name"],
        "version": doc["version"],
        "owner": owners[0]["username"] if owners else "unknown",
    }
    if (doc.get("description") or {}).get("purpose"):
        raw["description"] = doc["description"]["purpose"]
    raw["source"] = ml["source"]
    if "image" in ml:
        raw["image"] = ml["image"]
    if "allow_extra_columns" in ml:
        raw["allow_extra_columns"] = ml["allow_extra_columns"]
    raw["columns"] = [_column(p, where) for p in table.get("properties") or []]
    raw["roles"] = ml["roles"]
    rules = dict(ml.get("rules") or {})
    for check in table.get("quality") or []:
        if check.get("metric") != "rowCount":
            continue
        lo, hi = (check.get("mustBeBetween") or [None, None])[:2]
        lo = check.get("mustBeGreaterOrEqualTo", lo)
        hi = check.get("mustBeLessOrEqualTo", hi)
        rows = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
        if check.get("severity") == "warning":
            rows["severity"] = "warn"
        rules["row_count"] = rows
    if rules:
        raw["rules"] = dict(sorted(rules.items(), key=lambda kv: kv[0] != "row_count"))
    if "drift" in ml:
        raw["drift"] = ml["drift"]
    raw["split"] = ml["split"]
    return raw
