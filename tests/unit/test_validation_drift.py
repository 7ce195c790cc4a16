"""Drift against the previous validated snapshot: statistics and the gate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.support.validation_data import transactions, write_snapshot
from trainyard.contracts import DriftRule, load_contract
from trainyard.validation.drift import ColumnProfile, NumericStats, drift_value, histogram_edges
from trainyard.validation.runner import run_contract

CONTRACT = load_contract("transactions")


def _make(tmp_path: Path, name: str, cols: dict[str, list]) -> list[Path]:
    return write_snapshot(tmp_path / name, cols, shards=3)


def _only_online(cols: dict[str, list]) -> None:
    cols["merchant_category"] = ["online"] * len(cols["merchant_category"])


def _late_hours(cols: dict[str, list]) -> None:
    cols["hour"] = [20 + h % 4 for h in cols["hour"]]


def _shift(cols: dict[str, list]) -> None:
    cols["amount"] = [a + 40.0 for a in cols["amount"]]


def _nothing(cols: dict[str, list]) -> None:
    return None


CASES = [
    ("same-distribution", _nothing, set(), set()),
    ("amount-shifted", _shift, {("drift:mean_shift", "amount"), ("drift:ks", "amount")}, set()),
    ("category-mix-changed", _only_online, {("drift:psi", "merchant_category")}, set()),
    ("hours-moved-warn-only", _late_hours, set(), {("drift:psi", "hour")}),
]


@pytest.mark.parametrize(("case", "change", "errors", "warns"), CASES, ids=[c[0] for c in CASES])
def test_drift_rules(tmp_path: Path, case: str, change, errors: set, warns: set) -> None:
    old = _make(tmp_path, "old", transactions(4000, seed=1))
    cols = transactions(4000, seed=2)
    change(cols)
    new = _make(tmp_path, "new", cols)
    run = run_contract(CONTRACT, new, previous_files=old, previous_id="old", batch_rows=1000)
    drift = [o for o in run.outcomes if o.rule.startswith("drift:")]
    assert len(drift) == len(CONTRACT.drift)
    failed = {(o.rule, o.column) for o in drift if not o.success and o.severity == "error"}
    warned = {(o.rule, o.column) for o in drift if not o.success and o.severity == "warn"}
    assert (failed, warned) == (errors, warns)
    for o in drift:
        if not o.success:
            assert "against snapshot old" in o.reason


def test_batched_statistics_match_numpy_and_scipy(tmp_path: Path) -> None:
    from scipy import stats

    a = transactions(5000, seed=3)
    b = transactions(5000, seed=4, amount_shift=5.0)
    run = run_contract(
        CONTRACT,
        _make(tmp_path, "b", b),
        previous_files=_make(tmp_path, "a", a),
        batch_rows=700,
    )
    got = {o.rule: o.observed for o in run.outcomes if o.column == "amount"}
    old, new = np.array(a["amount"]), np.array(b["amount"])
    assert got["drift:mean_shift"] == pytest.approx(
        abs(new.mean() - old.mean()) / old.std(), rel=1e-6
    )
    ks = stats.ks_2samp(new, old).statistic
    assert got["drift:ks"] == pytest.approx(ks, abs=0.01)
    cats = sorted(set(a["merchant_category"]))
    p = np.array([b["merchant_category"].count(c) for c in cats]) / 5000
    q = np.array([a["merchant_category"].count(c) for c in cats]) / 5000
    psi = float(((p - q) * np.log(p / q)).sum())
    psi_outcome = next(
        o for o in run.outcomes if o.rule == "drift:psi" and o.column == "merchant_category"
    )
    assert psi_outcome.observed == pytest.approx(psi, rel=1e-6)


def test_vanished_category_scores_high() -> None:
    import pandas as pd

    rule = DriftRule(column="c", method="psi", max=0.2)
    old, new = ColumnProfile(categorical=True), ColumnProfile(categorical=True)
    old.update(pd.Series(["a"] * 500 + ["b"] * 500))
    new.update(pd.Series(["a"] * 1000))
    assert drift_value(rule, new, old) > 3


@pytest.mark.parametrize(
    ("case", "chunks"),
    [
        ("one", [np.arange(10.0)]),
        ("uneven", [np.arange(3.0), np.arange(3.0, 10.0)]),
        ("with-empty", [np.empty(0), np.arange(10.0)]),
    ],
)
def test_numeric_stats_merge(case: str, chunks: list[np.ndarray]) -> None:
    s = NumericStats()
    for c in chunks:
        s.update(c)
    assert (s.count, s.mean, s.min, s.max) == (10, 4.5, 0.0, 9.0)
    assert s.std == pytest.approx(np.arange(10.0).std())


def test_constant_previous_column() -> None:
    import pandas as pd

    edges = histogram_edges(NumericStats(count=3, mean=1, m2=0, min=1, max=1), 10)
    old = ColumnProfile(categorical=False, edges=edges)
    new = ColumnProfile(categorical=False, edges=edges)
    old.update(pd.Series([1.0, 1.0, 1.0]))
    new.update(pd.Series([1.0, 1.0, 1.0]))
    assert drift_value(DriftRule(column="x", method="mean_shift", max=1), new, old) == 0
    new.update(pd.Series([5.0]))
    assert math.isinf(drift_value(DriftRule(column="x", method="mean_shift", max=1), new, old))


def test_huge_values_update_the_drift_statistics_without_a_warning() -> None:
    """Found by a cold user: 1e308 in a column printed numpy's overflow warning, with its
    source line, in the middle of the validation report."""
    import warnings

    import numpy as np

    from trainyard.validation.drift import NumericStats

    stats = NumericStats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats.update(np.array([1e308, -1e308, 1e308, 5.0]))
    assert stats.count == 4 and stats.max == 1e308 and stats.min == -1e308
