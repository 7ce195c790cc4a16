"""The contract -> GX suite translator: one expectation per rule, with its severity and scope."""

from __future__ import annotations

import pytest

from trainyard.contracts import load_contract
from trainyard.validation.suite import build_suite, rule_meta

TRANSACTIONS = [
    (
        "row_count",
        None,
        "expect_table_row_count_to_be_between",
        {"min_value": 1000},
        "error",
        "dataset",
    ),
    ("nullable", "txn_id", "expect_column_values_to_not_be_null", {}, "error", "batch"),
    (
        "regex",
        "txn_id",
        "expect_column_values_to_match_regex",
        {"regex": r"^[A-Za-z0-9_-]+\Z"},  # the contract's final $: the value's end
        "error",
        "batch",
    ),
    (
        "length",
        "txn_id",
        "expect_column_value_lengths_to_be_between",
        {"max_value": 64},
        "error",
        "batch",
    ),
    ("unique", "txn_id", "expect_column_values_to_be_unique", {}, "error", "dataset"),
    (
        "range",
        "amount",
        "expect_column_values_to_be_between",
        {"min_value": 0, "strict_min": True},
        "error",
        "batch",
    ),
    (
        "range",
        "hour",
        "expect_column_values_to_be_between",
        {"min_value": 0, "max_value": 23},
        "error",
        "batch",
    ),
    (
        "allowed_values",
        "merchant_category",
        "expect_column_values_to_be_in_set",
        {},
        "error",
        "batch",
    ),
    (
        "min",
        "customer_age",
        "expect_column_values_to_be_between",
        {"min_value": 18},
        "error",
        "batch",
    ),
    (
        "max",
        "customer_age",
        "expect_column_values_to_be_between",
        {"max_value": 90},
        "warn",
        "batch",
    ),
    (
        "all_values_present",
        "is_fraud",
        "expect_column_distinct_values_to_contain_set",
        {"value_set": [0, 1]},
        "error",
        "dataset",
    ),
]


@pytest.fixture(scope="module")
def compiled() -> dict:
    suite = build_suite(load_contract("transactions"))
    out = {}
    for exp in suite.expectations:
        meta = rule_meta(exp)
        key = (meta["rule"], meta["column"])
        assert key not in out, f"two expectations for {key}"
        out[key] = (exp.expectation_type, exp.configuration.kwargs, meta)
    return out


@pytest.mark.parametrize(
    ("rule", "column", "gx_type", "kwargs", "severity", "scope"),
    TRANSACTIONS,
    ids=[f"{r}-{c}" for r, c, *_ in TRANSACTIONS],
)
def test_rule_compiles_to_expectation(
    compiled: dict,
    rule: str,
    column: str | None,
    gx_type: str,
    kwargs: dict,
    severity: str,
    scope: str,
) -> None:
    got_type, got_kwargs, meta = compiled[(rule, column)]
    assert got_type == gx_type
    for key, value in kwargs.items():
        assert got_kwargs[key] == value, key
    assert (meta["severity"], meta["scope"]) == (severity, scope)


def test_scopes_partition_the_suite() -> None:
    contract = load_contract("digits")
    full = build_suite(contract)
    batch = build_suite(contract, scopes=("batch",))
    dataset = build_suite(contract, scopes=("dataset",))
    assert len(full.expectations) == len(batch.expectations) + len(dataset.expectations)
    assert {rule_meta(e)["rule"] for e in dataset.expectations} == {
        "row_count",
        "unique",
        "all_values_present",
    }
    assert full.name == "digits-1.0.0"
