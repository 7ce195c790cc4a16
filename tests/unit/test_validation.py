from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.validation_data import SCHEMA, Mutation, setter, transactions, write_snapshot
from trainyard.contracts import load_contract
from trainyard.errors import SnapshotError, ValidationFailed
from trainyard.validation import ValidatorCrashed, validate_snapshot
from trainyard.validation.runner import KeyUniqueness

CONTRACT = load_contract("transactions")


def _all(*mutations: Mutation) -> Mutation:
    def apply(cols: dict[str, list]) -> None:
        for m in mutations:
            m(cols)

    return apply


def _drop_class(cols: dict[str, list]) -> None:
    cols["is_fraud"] = [0] * len(cols["is_fraud"])


def _duplicate_across_shards(cols: dict[str, list]) -> None:
    cols["txn_id"][1900] = cols["txn_id"][3]


def _run(tmp_path: Path, cols: dict[str, list], **kwargs: Any) -> Any:
    snap = tmp_path / "snap"
    files = write_snapshot(snap, cols, schema=kwargs.pop("schema", SCHEMA))
    return validate_snapshot(
        CONTRACT, snap, files, batch_rows=kwargs.pop("batch_rows", 1000), **kwargs
    )


# (case, mutation, failing (rule, column), a sample value, text in the reason)
BLOCKING = [
    ("null-in-non-null", setter("amount", 5, None), ("nullable", "amount"), None, "null value"),
    (
        "above-max",
        setter("hour", 1500, 24),
        ("range", "hour"),
        24,
        "outside [0, 23] (keys 't0_001500'; values 24)",
    ),
    ("strict-min", setter("amount", 7, 0.0), ("range", "amount"), 0.0, "outside (0, 1000000]"),
    ("below-min", setter("customer_age", 9, 17), ("min", "customer_age"), 17, "outside [18, inf]"),
    (
        "not-allowed",
        setter("merchant_category", 11, "casino"),
        ("allowed_values", "merchant_category"),
        "casino",
        "not in the allowed set",
    ),
    ("regex", setter("txn_id", 13, "bad id!"), ("regex", "txn_id"), "bad id!", "do not match"),
    # Python's $ also matches before a final newline: the contract's $ is the value's end
    ("regex-newline", setter("txn_id", 13, "t13\n"), ("regex", "txn_id"), "t13\n", "do not match"),
    ("length", setter("txn_id", 17, "x" * 70), ("length", "txn_id"), "x" * 70, "length outside"),
    (
        "duplicate-key",
        _duplicate_across_shards,
        ("unique", "txn_id"),
        "t0_000003",
        "2 row(s) share",
    ),
    ("class-disappeared", _drop_class, ("all_values_present", "is_fraud"), None, "never seen: [1]"),
]


@pytest.mark.parametrize(
    ("case", "mutate", "failing", "sample", "reason"), BLOCKING, ids=[c[0] for c in BLOCKING]
)
def test_blocking_rule_rejects_snapshot(
    tmp_path: Path, case: str, mutate: Mutation, failing: tuple, sample: Any, reason: str
) -> None:
    cols = transactions()
    mutate(cols)
    with pytest.raises(ValidationFailed) as err:
        _run(tmp_path, cols)
    assert reason in str(err.value)
    report = tmp_path / "snap" / "validation"
    rejected = json.loads((report / "rejected.json").read_text())
    summary = json.loads((report / "summary.json").read_text())
    assert rejected == summary and summary["success"] is False
    failed = [(f["rule"], f["column"]) for f in summary["failures"]]
    assert failed == [failing]
    if sample is not None:
        assert summary["failures"][0]["samples"][0] == sample
    assert (report / "data_docs" / "index.html").stat().st_size > 1000


def test_clean_snapshot_passes_with_report(tmp_path: Path) -> None:
    result = _run(tmp_path, transactions())
    assert result.success and result.failures == [] and result.warnings == []
    assert result.rows == 2000
    assert not (result.report_dir / "rejected.json").exists()
    summary = json.loads((result.report_dir / "summary.json").read_text())
    assert summary["rows"] == 2000 and summary["batches"] == 2
    rules = {(r["rule"], r["column"]) for r in summary["rules"]}
    assert {("row_count", None), ("unique", "txn_id"), ("range", "amount")} <= rules
    html = (result.report_dir / "data_docs" / "index.html").read_text()
    assert "transactions-1.0.0" in html and "txn_id" in html
    # found by a new user: the page's links into a Data Docs site (its index, the suite's
    # page, static files) led to Airflow's 404; with no internet it had no styling at all
    assert not re.search(r'(href|src)="\.\./', html)
    assert "<head><style>body{" in html and "border-collapse" in html
    assert result.table.splitlines()[0].split()[:4] == ["status", "rule", "column", "unexpected"]


def test_warn_rule_reports_but_does_not_block(tmp_path: Path) -> None:
    cols = transactions()
    cols["customer_age"][3] = 95
    result = _run(tmp_path, cols)
    assert result.success
    assert [(w["rule"], w["column"], w["samples"]) for w in result.warnings] == [
        ("max", "customer_age", [95])
    ]
    assert "warn" in result.table and "95" in result.table


def test_row_count_is_dataset_level(tmp_path: Path) -> None:
    # 600 rows in batches of 500: each batch alone says nothing about the 1000-row minimum.
    with pytest.raises(
        ValidationFailed, match=r"600 rows, the contract allows \[1000, 100000000\]"
    ):
        _run(tmp_path, transactions(600))


SCHEMA_DRIFT = [
    ("renamed", lambda c: c.update(amt=c.pop("amount")), ["'amount' is missing", "'amt'"]),
    ("added", lambda c: c.update(extra=[1] * len(c["hour"])), ["unexpected column 'extra'"]),
    (
        "retyped",
        lambda c: c.update(hour=[float(h) for h in c["hour"]]),
        ["'hour' is double, the contract says int64"],
    ),
]


@pytest.mark.parametrize(
    ("case", "change", "reasons"), SCHEMA_DRIFT, ids=[c[0] for c in SCHEMA_DRIFT]
)
def test_schema_drift_blocks(tmp_path: Path, case: str, change: Any, reasons: list[str]) -> None:
    cols = transactions()
    change(cols)
    with pytest.raises(ValidationFailed) as err:
        _run(tmp_path, cols, schema=None)
    for reason in reasons:
        assert reason in str(err.value)
    summary = json.loads((tmp_path / "snap" / "validation" / "rejected.json").read_text())
    assert {f["rule"] for f in summary["failures"]} == {"schema"}


def test_revalidation_replaces_the_report(tmp_path: Path) -> None:
    cols = transactions()
    cols["hour"][0] = 99
    with pytest.raises(ValidationFailed):
        _run(tmp_path, cols)
    report = tmp_path / "snap" / "validation"
    assert (report / "rejected.json").exists()
    cols["hour"][0] = 1
    result = _run(tmp_path, cols)
    assert result.success and not (report / "rejected.json").exists()
    assert [p.name for p in (tmp_path / "snap").iterdir() if p.name.startswith(".")] == []


def test_unreadable_shard_is_a_snapshot_error(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    files = write_snapshot(snap, transactions())
    files[1].write_bytes(b"not parquet at all")
    with pytest.raises(SnapshotError, match=r"part-00001\.parquet"):
        validate_snapshot(CONTRACT, snap, files)
    assert not (snap / "validation").exists()


def test_validator_crash_is_not_a_data_failure(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    files = write_snapshot(snap, transactions())
    with pytest.raises(ValidatorCrashed, match="validator crashed") as err:
        validate_snapshot(CONTRACT, snap, files, work_dir=tmp_path / "missing-dir")
    assert not isinstance(err.value, ValidationFailed)
    assert not (snap / "validation").exists()


@pytest.mark.parametrize(
    ("case", "n", "batch_rows", "dups"),
    [
        ("in-memory", 3000, 10_000, [(1, 2999)]),
        ("spilled-across-batches", 20_000, 1000, [(5, 19_000), (6, 7), (100, 101), (100, 102)]),
        ("spilled-no-duplicates", 20_000, 700, []),
    ],
)
def test_key_uniqueness_matches_pandas(
    tmp_path: Path, case: str, n: int, batch_rows: int, dups: list[tuple[int, int]]
) -> None:
    import pandas as pd

    keys = [f"k{i}" for i in range(n)]
    for src, dst in dups:
        keys[dst] = keys[src]
    keys[10] = None
    column = pa.array(keys)
    acc = KeyUniqueness(n, batch_rows, tmp_path)
    for start in range(0, n, batch_rows):
        acc.add(column.slice(start, batch_rows))
    hashes, rows = acc.duplicates()
    present = pd.Series(keys).dropna()
    assert rows == int(present.duplicated(keep=False).sum())
    assert len(hashes) == present[present.duplicated()].nunique()
    assert (acc.element_count, acc.missing_count) == (n, 1)
    assert acc.bits == (
        0 if case == "in-memory" else len(list(tmp_path.glob("*.u64"))).bit_length() - 1
    )


def test_table_type_check_accepts_large_string(tmp_path: Path) -> None:
    schema = SCHEMA.set(0, pa.field("txn_id", pa.large_string()))
    assert _run(tmp_path, transactions(), schema=schema).success


FRESH_CONTRACT = """
dataset: events
version: 2.0.0
owner: data@example.com
source: {{format: parquet}}
columns:
  - {{name: id, type: string, nullable: false, unique: true}}
  - {{name: ts, type: timestamp, nullable: false}}
  - {{name: x, type: float64}}
  - {{name: y, type: int64, allowed_values: [0, 1]}}
roles: {{key: id, label: y, features: [x], num_classes: 2}}
rules:
  freshness: {{max_age_hours: 24, {column}severity: {severity}}}
split: {{holdout_fraction: 0.5, by: id}}
"""


@pytest.mark.parametrize(
    ("case", "age_hours", "column", "severity", "created_age_hours", "outcome"),
    [
        ("fresh-column", 2, True, "error", None, "ok"),
        ("stale-column-blocks", 72, True, "error", None, "blocks"),
        ("stale-column-warns", 72, True, "warn", None, "warns"),
        ("fresh-snapshot", None, False, "error", 1, "ok"),
        ("stale-snapshot", None, False, "error", 50, "blocks"),
    ],
)
def test_freshness(
    tmp_path: Path,
    case: str,
    age_hours: float | None,
    column: bool,
    severity: str,
    created_age_hours: float | None,
    outcome: str,
) -> None:
    import datetime as dt

    from trainyard.contracts import parse_contract_text

    text = FRESH_CONTRACT.format(column="column: ts, " if column else "", severity=severity)
    contract = parse_contract_text(text, tmp_path / "events.yaml")
    now = dt.datetime.now(dt.UTC)
    newest = now - dt.timedelta(hours=age_hours or 1)
    cols = {
        "id": ["a", "b", "c"],
        "ts": [newest - dt.timedelta(hours=5), newest, newest - dt.timedelta(hours=1)],
        "x": [1.0, 2.0, 3.0],
        "y": [0, 1, 1],
    }
    snap = tmp_path / "snap"
    files = write_snapshot(snap, cols, shards=1, schema=None)
    created = (now - dt.timedelta(hours=created_age_hours or 0)).isoformat()
    kwargs = {"created_at": created}
    if outcome == "blocks":
        with pytest.raises(ValidationFailed, match=r"h old, the contract allows 24"):
            validate_snapshot(contract, snap, files, **kwargs)
        return
    result = validate_snapshot(contract, snap, files, **kwargs)
    assert result.success
    assert [w["rule"] for w in result.warnings] == (["freshness"] if outcome == "warns" else [])


def test_empty_snapshot_blocks_on_row_count(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    snap.mkdir()
    with pytest.raises(ValidationFailed, match=r"0 rows, the contract allows \[1000"):
        validate_snapshot(CONTRACT, snap, [])
    summary = json.loads((snap / "validation" / "rejected.json").read_text())
    assert [f["rule"] for f in summary["failures"]] == ["row_count", "all_values_present"]


LABEL_CONTRACT = """
dataset: labels
version: 1.0.0
owner: data@example.com
source: {{format: parquet}}
columns:
  - {{name: id, type: string, nullable: false, unique: true}}
  - {{name: x, type: float64}}
  - {{name: y, type: {type}}}
roles: {{key: id, label: y, features: [x], {roles}}}
split: {{holdout_fraction: 0.5, by: id}}
"""


@pytest.mark.parametrize(
    ("case", "type_", "roles", "labels", "message"),
    [
        # found by a new user: num_classes alone let a label 5 through to training
        ("class-id-beyond-the-count", "int64", "num_classes: 3", [0, 5, 2], r"not in the allowed"),
        ("negative-class-id", "int64", "num_classes: 3", [0, -1, 2], r"not in the allowed"),
        ("null-class-id", "int64", "num_classes: 3", [0, None, 2], r"null"),
        ("null-regression-target", "float64", "task: regression", [1.5, None, 2.0], r"null"),
    ],
)
def test_the_label_role_implies_its_rules(
    tmp_path: Path, case: str, type_: str, roles: str, labels: list, message: str
) -> None:
    from trainyard.contracts import parse_contract_text

    text = LABEL_CONTRACT.format(type=type_, roles=roles)
    contract = parse_contract_text(text, tmp_path / "labels.yaml")
    cols = {"id": ["a", "b", "c"], "x": [1.0, 2.0, 3.0], "y": labels}
    snap = tmp_path / "snap"
    files = write_snapshot(snap, cols, shards=1, schema=None)
    with pytest.raises(ValidationFailed, match=message):
        validate_snapshot(contract, snap, files)
    good = {**cols, "y": [0, 1, 2] if type_ == "int64" else [1.5, 2.5, 3.0]}
    snap2 = tmp_path / "snap2"
    assert validate_snapshot(contract, snap2, write_snapshot(snap2, good, 1, None)).success


def test_a_failed_rule_names_its_rows_by_key_across_shards(tmp_path: Path) -> None:
    """Found by a cold user: validation numbered rows from 0 through the snapshot and
    staging by file line, so "row 3" pointed at another line of the CSV. A failed rule
    now names its sample rows by the key column, which finds them in any source file."""
    cols = transactions()
    n = len(cols["hour"])
    picked = [5, n // 2 + 7, n - 1]  # in the first shard and the second
    for row in picked:
        cols["hour"][row] = 99
    cols["txn_id"][picked[1]] = "odd 'key'"
    with pytest.raises(ValidationFailed) as err:
        _run(tmp_path, cols)
    summary = json.loads((tmp_path / "snap" / "validation" / "summary.json").read_text())
    failure = next(f for f in summary["failures"] if f["column"] == "hour")
    assert failure["rows"] == picked
    assert failure["keys"] == [cols["txn_id"][r] for r in picked]
    expected = ", ".join(repr(cols["txn_id"][r]) for r in picked)
    assert f"(keys {expected}; values 99, 99, 99)" in str(err.value)
