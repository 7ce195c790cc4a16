"""The gate has no ratchet: the served model never ends more than ``max_regression`` below
the best version served on the same holdout, over any sequence of candidates.

Found by a new user (issue 38): runs of digits on one snapshot gave 0.9432, 0.9290
(rejected), ..., 0.9347 (promoted), then 0.9290 promoted against 0.9347: each step within
``max_regression: 0.01`` of the champion, the served model 0.0142 below the best served.
Table-driven over the pure gate (``decide``) and a lineage kept as the registry keeps it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from trainyard.config import GateConfig
from trainyard.evaluation.gate import LineageScore, decide

DIGITS = {
    "metrics": ["accuracy"],
    "thresholds": {"accuracy": {"min": 0.85}},
    "champion": {"metric": "accuracy", "max_regression": 0.01},
}


def _gate(champion: dict[str, Any]) -> GateConfig:
    return GateConfig.model_validate({**DIGITS, "champion": champion})


def serve(gate: GateConfig, candidates: list[float], lineage: bool = True) -> list[list[float]]:
    """Gate each candidate in turn as the evaluate step does; the values served after each.

    Every version keeps its value on the (one) holdout; the champion is compared as such,
    the versions served before it as the lineage (``Registry.served_versions``).
    """
    assert gate.champion is not None
    metric = gate.champion.metric
    values: dict[int, float] = {}
    served: list[int] = []  # every version that was the champion, oldest first
    champion: int | None = None
    trace = []
    for version, value in enumerate(candidates, 1):
        values[version] = value
        before = [
            LineageScore(v, {metric: values[v]}) for v in dict.fromkeys(served) if v != champion
        ]
        decision = decide(
            gate,
            {metric: value},
            {metric: values[champion]} if champion is not None else None,
            lineage=before if lineage else (),
        )
        if decision.promote:
            champion = version
            served.append(version)
        trace.append([values[v] for v in served])
    return trace


def worst_slide(gate: GateConfig, trace: list[list[float]]) -> float:
    """How far the served model ever ended below the best served before it (0: never)."""
    assert gate.champion is not None
    sign = 1.0 if gate.champion.higher_is_better else -1.0
    worst = 0.0
    for served in trace:
        if not served:
            continue
        best = max(served, key=lambda v: sign * v)
        slide = sign * (best - served[-1])
        if gate.champion.relative:
            slide /= abs(best)
        worst = max(worst, slide)
    return worst


def _walk(seed: int, start: float, step: float, n: int, lo: float = 0.86) -> list[float]:
    """Candidates each within ``step`` of the one before (a random walk, floored at ``lo``)."""
    rng = random.Random(seed)
    out = [start]
    while len(out) < n:
        out.append(max(lo, out[-1] + rng.uniform(-step, step)))
    return out


# (case, champion rule, candidates: each within max_regression of the one before)
SEQUENCES = [
    (
        "issue 38: the runs a new user saw",
        {"metric": "accuracy", "max_regression": 0.01},
        [0.9432, 0.9290, 0.9432, 0.9432, 0.9432, 0.9347, 0.9290],
    ),
    (
        "a slow slide, each step tolerated",
        {"metric": "accuracy", "max_regression": 0.01},
        [0.9432, 0.9347, 0.9260, 0.9175, 0.9090, 0.9005, 0.8920],
    ),
    (
        "up, then down by steps",
        {"metric": "accuracy", "max_regression": 0.02},
        [0.90, 0.93, 0.95, 0.935, 0.92, 0.905, 0.94, 0.925, 0.91],
    ),
    (
        "lower is better, relative tolerance",
        {"metric": "loss", "higher_is_better": False, "max_regression": 0.05, "relative": True},
        [0.20, 0.209, 0.218, 0.228, 0.238, 0.249, 0.26],
    ),
    (
        "min_improvement: only better ones ship",
        {"metric": "accuracy", "min_improvement": 0.005},
        [0.90, 0.904, 0.91, 0.908, 0.9151, 0.912],
    ),
    (
        "a random walk of 300 candidates",
        {"metric": "accuracy", "max_regression": 0.01},
        _walk(7, 0.93, 0.01, 300),
    ),
    (
        "another random walk, wide tolerance",
        {"metric": "accuracy", "max_regression": 0.03},
        _walk(11, 0.92, 0.03, 300),
    ),
]


@pytest.mark.parametrize(("case", "rule", "candidates"), SEQUENCES, ids=[s[0] for s in SEQUENCES])
def test_the_served_model_never_slides_below_the_best_served(
    case: str, rule: dict[str, Any], candidates: list[float]
) -> None:
    gate = _gate(rule)
    if rule["metric"] == "loss":
        gate = gate.model_copy(update={"metrics": ["loss"], "thresholds": {}})
    trace = serve(gate, candidates)
    assert worst_slide(gate, trace) <= gate.champion.max_regression + 1e-9, trace[-1]


@pytest.mark.parametrize("case", [0, 1, 3, 5], ids=lambda i: SEQUENCES[i][0])
def test_the_champion_rule_alone_is_a_ratchet(case: int) -> None:
    """What the lineage checks prevent: compared with the champion only, it slides."""
    _, rule, candidates = SEQUENCES[case]
    gate = _gate(rule)
    if rule["metric"] == "loss":
        gate = gate.model_copy(update={"metrics": ["loss"], "thresholds": {}})
    assert worst_slide(gate, serve(gate, candidates, lineage=False)) > rule["max_regression"]


def test_one_step_keeps_its_meaning_and_the_report_shows_each_comparison() -> None:
    """``max_regression`` still tolerates one step below the champion; a version served
    before is compared too, and ``gate.md`` has a row for it."""
    gate = _gate({"metric": "accuracy", "max_regression": 0.01})
    lineage = [LineageScore(1, {"accuracy": 0.9432}), LineageScore(2, {"accuracy": 0.9347})]
    within = decide(gate, {"accuracy": 0.9340}, {"accuracy": 0.9347}, lineage=lineage[:1])
    assert within.verdict == "promote", within.reason
    assert "best served 0.9432 (v1)" in within.reason
    slid = decide(gate, {"accuracy": 0.9290}, {"accuracy": 0.9347}, lineage=lineage[:1])
    assert slid.verdict == "reject"
    assert [c.name for c in slid.checks if not c.passed] == ["lineage:v1"]
    assert "regresses from version 1 by 0.0142, served before" in slid.reason
    report = slid.to_markdown()
    assert "| lineage:v1 | accuracy | 0.9290 | 0.9432 | >= 0.9332" in report
    assert "(the best served on this holdout)" in report
    assert "Served before, scored on this holdout: v1 0.9432." in report
    assert slid.to_dict()["lineage"] == [
        {"version": 1, "metric": "accuracy", "value": 0.9432, "error": None}
    ]


def test_a_version_served_before_that_cannot_be_scored_rejects() -> None:
    gate = _gate({"metric": "accuracy", "max_regression": 0.01})
    broken = LineageScore(3, error="version 3 (served before) evaluation failed: OSError: gone")
    decision = decide(gate, {"accuracy": 0.95}, {"accuracy": 0.94}, lineage=[broken])
    assert decision.verdict == "reject"
    assert "lineage:v3 version 3 (served before) evaluation failed" in decision.reason
