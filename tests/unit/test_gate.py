"""Table-driven tests of the evaluation gate (``trainyard.evaluation.gate.decide``)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from trainyard.config import GateConfig
from trainyard.errors import GateRejected
from trainyard.evaluation.gate import ForceRequest, decide

DIGITS_GATE = {
    "metrics": ["accuracy", "loss"],
    "thresholds": {"accuracy": {"min": 0.85}},
    "champion": {"metric": "accuracy", "higher_is_better": True, "max_regression": 0.01},
}
FORCE = ForceRequest(actor="alice", reason="hotfix for label bug", at="2026-11-20T10:00:00+00:00")


def gate(**overrides: Any) -> GateConfig:
    return GateConfig.model_validate({**DIGITS_GATE, **overrides})


# (case, gate, candidate, champion, force, verdict, failed check names, reason fragment)
CASES = [
    ("threshold pass first run", gate(), {"accuracy": 0.9, "loss": 0.3}, None, None,
     "promote", [], "first run"),
    ("threshold fail first run", gate(), {"accuracy": 0.8, "loss": 0.3}, None, None,
     "reject", ["threshold:accuracy"], "threshold:accuracy below minimum"),
    ("threshold max bound", gate(thresholds={"loss": {"max": 0.5}}), {"accuracy": 0.9, "loss": 0.6},
     None, None, "reject", ["threshold:loss"], "above maximum"),
    ("threshold exactly at min", gate(), {"accuracy": 0.85, "loss": 0.3}, None, None,
     "promote", [], "All"),
    ("champion better", gate(), {"accuracy": 0.95, "loss": 0.2}, {"accuracy": 0.93, "loss": 0.25},
     None, "promote", [], "accuracy 0.9500 vs champion 0.9300"),
    ("champion equal", gate(), {"accuracy": 0.93, "loss": 0.2}, {"accuracy": 0.93, "loss": 0.2},
     None, "promote", [], "All 4 checks passed"),
    ("champion worse within tolerance (float edge)", gate(), {"accuracy": 0.89, "loss": 0.2},
     {"accuracy": 0.9, "loss": 0.2}, None, "promote", [], "All"),
    ("min improvement exactly met (float edge)",
     gate(champion={"metric": "loss", "higher_is_better": False, "min_improvement": 0.1}),
     {"accuracy": 0.9, "loss": 0.2}, {"loss": 0.3}, None, "promote", [], ""),
    ("champion worse beyond tolerance", gate(), {"accuracy": 0.88, "loss": 0.2},
     {"accuracy": 0.9, "loss": 0.2}, None, "reject", ["champion:accuracy"], "champion:accuracy"),
    ("min improvement absolute not met",
     gate(champion={"metric": "accuracy", "min_improvement": 0.02}),
     {"accuracy": 0.91, "loss": 0.2}, {"accuracy": 0.9}, None, "reject", ["champion:accuracy"], ""),
    ("min improvement absolute met",
     gate(champion={"metric": "accuracy", "min_improvement": 0.02}),
     {"accuracy": 0.92, "loss": 0.2}, {"accuracy": 0.9}, None, "promote", [], ""),
    ("relative improvement on lower-is-better loss met",
     gate(champion={"metric": "loss", "higher_is_better": False, "min_improvement": 0.1,
                    "relative": True}),
     {"accuracy": 0.9, "loss": 0.45}, {"loss": 0.5}, None, "promote", [], ""),
    ("relative improvement on lower-is-better loss not met",
     gate(champion={"metric": "loss", "higher_is_better": False, "min_improvement": 0.1,
                    "relative": True}),
     {"accuracy": 0.9, "loss": 0.46}, {"loss": 0.5}, None, "reject", ["champion:loss"], ""),
    ("relative tolerated regression", gate(champion={"metric": "accuracy", "relative": True,
                                                     "max_regression": 0.05}),
     {"accuracy": 0.86, "loss": 0.2}, {"accuracy": 0.9}, None, "promote", [], ""),
    ("missing metric rejects", gate(), {"accuracy": 0.9}, None, None,
     "reject", ["metric:loss"], "metric:loss missing"),
    ("NaN metric rejects", gate(), {"accuracy": 0.9, "loss": math.nan}, None, None,
     "reject", ["metric:loss"], "not finite"),
    ("champion lacks compared metric rejects", gate(), {"accuracy": 0.9, "loss": 0.2},
     {"loss": 0.2}, None, "reject", ["champion:accuracy"], "champion value missing"),
    ("force promote over failed threshold", gate(), {"accuracy": 0.5, "loss": 0.9}, None, FORCE,
     "forced", ["threshold:accuracy"], "Forced by alice"),
    ("force not needed", gate(), {"accuracy": 0.9, "loss": 0.3}, None, FORCE,
     "promote", [], "was not needed"),
    ("slices pass", gate(slices=["label"]),
     {"accuracy": 0.9, "loss": 0.3, "accuracy@label=0": 0.9, "accuracy@label=1": 0.88}, None, None,
     "promote", [], ""),
    ("slice below threshold rejects", gate(slices=["label"]),
     {"accuracy": 0.9, "loss": 0.3, "accuracy@label=0": 0.95, "accuracy@label=1": 0.7}, None, None,
     "reject", ["slice:label=1"], "slice:label=1 below minimum"),
    ("slice column without metrics rejects", gate(slices=["region"]),
     {"accuracy": 0.9, "loss": 0.3, "accuracy@label=0": 0.95}, None, None,
     "reject", ["slice:region"], "no metrics for slice column"),
    ("explicit slice threshold", gate(thresholds={"accuracy@label=1": {"min": 0.8}}),
     {"accuracy": 0.9, "loss": 0.3, "accuracy@label=1": 0.75}, None, None,
     "reject", ["threshold:accuracy@label=1"], ""),
    ("no checks declared cannot decide", GateConfig(metrics=[]), {"accuracy": 0.9}, None, None,
     "reject", [], "cannot decide"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gate_cfg", "candidate", "champion", "force", "verdict", "failed", "fragment"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide(
    gate_cfg: GateConfig,
    candidate: dict[str, float],
    champion: dict[str, float] | None,
    force: ForceRequest | None,
    verdict: str,
    failed: list[str],
    fragment: str,
) -> None:
    decision = decide(gate_cfg, candidate, champion, force)
    assert decision.verdict == verdict, decision.reason
    assert decision.promote is (verdict != "reject")
    assert [c.name for c in decision.checks if not c.passed] == failed
    assert fragment in decision.reason
    assert decision.first_run is (champion is None)
    # every report renders and is strict JSON (NaN becomes null)
    data = json.loads(decision.to_json())
    assert data["verdict"] == verdict and len(data["checks"]) == len(decision.checks)
    md = decision.to_markdown()
    assert f"Gate: {verdict.upper()}" in md
    assert md.count("**FAIL**") == len(failed)


@pytest.mark.parametrize(
    ("candidate_error", "champion_error", "first_run", "failed"),
    [
        ("candidate evaluation failed: boom", None, True, ["evaluate:candidate", "metric:accuracy",
                                                           "metric:loss", "threshold:accuracy"]),
        (None, "champion unreadable: bad json", False, ["evaluate:champion"]),
    ],
    ids=["candidate crashed", "champion unreadable"],
)  # fmt: skip
def test_cannot_decide_rejects_with_reason(
    candidate_error: str | None, champion_error: str | None, first_run: bool, failed: list[str]
) -> None:
    candidate = {} if candidate_error else {"accuracy": 0.99, "loss": 0.01}
    decision = decide(
        gate(), candidate, None, candidate_error=candidate_error, champion_error=champion_error
    )
    assert decision.verdict == "reject"
    assert decision.first_run is first_run
    assert [c.name for c in decision.checks if not c.passed] == failed
    assert (candidate_error or champion_error or "").split(":")[0] in decision.reason


def test_first_run_report_says_so() -> None:
    decision = decide(gate(), {"accuracy": 0.9, "loss": 0.3}, None)
    assert "First run: there is no champion yet" in decision.to_markdown()
    assert not any(c.name.startswith("champion:") for c in decision.checks)


def test_champion_check_row_has_both_values_and_threshold() -> None:
    decision = decide(gate(), {"accuracy": 0.88, "loss": 0.2}, {"accuracy": 0.9, "loss": 0.25})
    row = next(c for c in decision.checks if c.name == "champion:accuracy")
    assert (row.candidate, row.champion, row.passed) == (0.88, 0.9, False)
    assert row.threshold.startswith(">= 0.8900")
    assert "regresses by 0.0200" in row.note
    assert "| champion:accuracy | accuracy | 0.8800 | 0.9000 | >= 0.8900" in decision.to_markdown()
    # a cold user read "equals by 0.0000"
    same = decide(gate(), {"accuracy": 0.9, "loss": 0.2}, {"accuracy": 0.9, "loss": 0.25})
    assert next(c for c in same.checks if c.name == "champion:accuracy").note == (
        "equals the champion"
    )


def test_forced_decision_records_who_when_why() -> None:
    decision = decide(gate(), {"accuracy": 0.5, "loss": 0.9}, None, FORCE)
    data = decision.to_dict()
    assert data["force"] == {"actor": "alice", "reason": "hotfix for label bug", "at": FORCE.at}
    assert "requested by **alice** at 2026-11-20T10:00:00+00:00: hotfix" in decision.to_markdown()
    assert decision.summary()["forced_by"] == "alice"


@pytest.mark.parametrize(
    ("actor", "reason"),
    [("alice", ""), ("alice", "   "), ("", "why")],
    ids=["empty", "blank", "no actor"],
)
def test_force_request_needs_reason_and_actor(actor: str, reason: str) -> None:
    with pytest.raises(GateRejected, match="force_promote needs"):
        ForceRequest(actor=actor, reason=reason, at="2026-11-20T10:00:00Z")


def test_summary_is_json_ready_with_nan_metric() -> None:
    decision = decide(gate(), {"accuracy": 0.9, "loss": math.nan}, None)
    text = json.dumps(decision.summary(), allow_nan=False)
    assert '"loss": null' in text


def test_a_champion_of_another_task_is_not_compared_and_does_not_block() -> None:
    """Found by a new user: after a pipeline's task changed, every candidate was rejected
    because the old champion could not be evaluated on the new metrics."""
    regression = GateConfig.model_validate(
        {"thresholds": {"rmse": {"max": 70}}, "champion": {"metric": "rmse"}}
    ).for_task("regression")
    why = "champion v2 is a classification model and the contract's task is now regression"
    ok = decide(regression, {"rmse": 60.0, "mae": 50.0, "r2": 0.4}, None, not_compared=why)
    assert ok.verdict == "promote" and not ok.first_run
    assert f"champion not compared: {why}; thresholds only" in ok.reason
    bad = decide(regression, {"rmse": 80.0, "mae": 50.0, "r2": 0.4}, None, not_compared=why)
    assert bad.verdict == "reject" and [c.name for c in bad.checks if not c.passed] == [
        "threshold:rmse"
    ]
    # time still counts: an older candidate is not promoted over the champion
    old = decide(
        regression,
        {"rmse": 60.0, "mae": 50.0, "r2": 0.4},
        None,
        data_times=("2026-11-01T00:00:00+00:00", "2026-11-05T00:00:00+00:00"),
        not_compared=why,
    )
    assert old.verdict == "reject" and "time:data" in old.reason


def test_a_forced_promotion_records_the_persons_reason() -> None:
    """Found by a cold user: the history row of a forced deploy said "deployed after gate
    on snapshot ...", and the reason typed in the form was only in ``force_request``."""
    from trainyard.steps import promotion_reason

    meta = {"snapshot_id": "0123456789abcdef"}
    forced = decide(gate(), {"accuracy": 0.5, "loss": 0.9}, None, FORCE)
    record = json.loads(forced.report_files()["gate.json"])
    assert promotion_reason(meta, record) == "forced by alice: hotfix for label bug"
    passed = json.loads(
        decide(gate(), {"accuracy": 0.95, "loss": 0.1}, None).report_files()["gate.json"]
    )
    assert promotion_reason(meta, passed) == "deployed after gate on snapshot 0123456789abcdef"
