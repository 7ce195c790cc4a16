"""Promotion respects time: a candidate trained on older data than the champion's is not
promoted unless forced with a reason, and the gate report says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard import volumes
from trainyard.config import GateConfig
from trainyard.errors import GateRejected
from trainyard.evaluation.gate import ForceRequest, decide
from trainyard.evaluation.step import newest_data

GATE = GateConfig.model_validate(
    {
        "metrics": ["accuracy"],
        "thresholds": {"accuracy": {"min": 0.5}},
        "champion": {"metric": "accuracy", "max_regression": 0.05},
    }
)
BETTER, WORSE = {"accuracy": 0.97}, {"accuracy": 0.90}
DAY2, DAY5 = "2026-11-02T03:00:00+00:00", "2026-11-05T03:00:00+00:00"


def test_older_data_is_not_promoted_even_with_better_metrics() -> None:
    d = decide(GATE, BETTER, WORSE, data_times=(DAY2, DAY5))
    assert d.verdict == "reject" and not d.promote
    time = next(c for c in d.checks if c.name == "time:data")
    assert not time.passed
    assert f"trained on data up to {DAY2}, older than the champion's (up to {DAY5})" in d.reason
    md = d.to_markdown()
    assert "time:data" in md and "older than the champion's" in md and "**FAIL**" in md
    assert json.loads(d.to_json())["checks"][-1]["name"] == "time:data"


def test_forcing_an_older_candidate_needs_and_records_a_reason() -> None:
    force = ForceRequest(actor="bob", reason="roll back a bad day", at="2026-11-06T00:00:00Z")
    d = decide(GATE, BETTER, WORSE, force, data_times=(DAY2, DAY5))
    assert d.verdict == "forced" and d.promote
    assert "roll back a bad day" in d.reason and "older than the champion's" in d.reason
    with pytest.raises(GateRejected, match="reason"):
        ForceRequest(actor="bob", reason=" ", at="2026-11-06T00:00:00Z")


@pytest.mark.parametrize(
    ("candidate", "champion", "note"),
    [
        (DAY5, DAY2, f"{DAY5} vs {DAY2}"),
        (DAY5, DAY5, f"{DAY5} vs {DAY5}"),
        ("2026-11-05", "2026-11-05T00:00:00+00:00", "vs"),
        (DAY5, None, "champion's data time unknown"),
    ],
    ids=["newer", "same", "date vs datetime", "unknown champion"],
)
def test_newer_or_same_data_passes_the_time_check(candidate, champion, note) -> None:
    d = decide(GATE, BETTER, WORSE, data_times=(candidate, champion))
    assert d.verdict == "promote", d.reason
    time = next(c for c in d.checks if c.name == "time:data")
    assert time.passed and note in time.note


def test_no_champion_means_no_time_check() -> None:
    d = decide(GATE, BETTER, None, data_times=(DAY2, None))
    assert d.verdict == "promote" and d.first_run
    assert not [c for c in d.checks if c.name.startswith("time:")]


def test_newest_data_of_a_version(volume_root: Path) -> None:
    window = [
        {"snapshot_id": "a", "interval": [DAY2, None]},
        {"snapshot_id": "b", "interval": [DAY5, None]},
    ]
    assert newest_data({"data_until": DAY5}) == DAY5
    assert newest_data({"dataset": "ds", "snapshot_id": "b", "snapshots": window}) == DAY5
    # a version registered before windows: its one snapshot's interval, from the manifest
    from tests.unit.test_volumes import make_snapshot

    sid = make_snapshot(volume_root, "ds", 3, DAY2)
    manifest = volumes.read_manifest(volumes.snapshot_dir("ds", sid))
    expect = (manifest.interval or {}).get("start") or manifest.created_at
    assert newest_data({"dataset": "ds", "snapshot_id": sid}) == expect
    assert newest_data({"dataset": "ds", "snapshot_id": "0" * 16}) is None
