"""Which snapshot a day's drift is measured against: the day before it, whatever ran since.

Found by a cold user: drift was measured against the dataset's newest validated snapshot,
so running a backfill again compared its first day with its last and rejected it, and a
day rejected on the first pass passed on the second.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.daily_csv import contract, days, read_csv, write_csv, write_days
from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard import volumes
from trainyard.config import PipelineConfig
from trainyard.errors import ValidationFailed
from trainyard.staging import stage
from trainyard.validation import validate

DAYS = days("2026-11-01", 4)
SHIFTED = DAYS[2]


def _interval(day: str) -> tuple[str, str]:
    after = days(day, 2)[1]
    return f"{day}T03:00:00+00:00", f"{after}T03:00:00+00:00"


@pytest.fixture
def daily(tmp_path: Path, volume_root: Path, monkeypatch: pytest.MonkeyPatch):
    raw = tmp_path / "raw"
    write_days(raw, DAYS)
    rows = read_csv(raw / f"{SHIFTED}.csv")
    for r in rows:  # the third day's radius is 60% larger: a unit or a sensor changed
        r["mean_radius"] = str(float(r["mean_radius"]) * 1.6)
    write_csv(raw / f"{SHIFTED}.csv", rows)
    doc = contract()
    doc["drift"] = [{"column": "mean_radius", "method": "mean_shift", "max": 0.5}]
    (tmp_path / "contracts").mkdir()
    (tmp_path / "contracts" / "cancer.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(tmp_path / "contracts"))
    return PipelineConfig.model_validate(pipeline_dict(raw))


def _run(cfg: PipelineConfig, day: str) -> tuple[str, bool, str | None]:
    """Stage and validate one day as its run does: (snapshot, passed, drift baseline)."""
    start, end = _interval(day)
    sid = stage(cfg, start, end, quiet=True).snapshot_id
    baseline = volumes.drift_baseline("cancer", sid, start)
    try:
        result = validate(cfg, sid, start)
    except ValidationFailed:
        return sid, False, baseline
    assert result.summary["previous_snapshot_id"] == baseline
    return sid, True, baseline


def test_each_day_is_compared_with_the_day_before_on_every_run(daily) -> None:
    first = {day: _run(daily, day) for day in DAYS}
    d0, d1, d2, d3 = (first[d][0] for d in DAYS)
    assert [first[d][1] for d in DAYS] == [True, True, False, True]
    # the first day has nothing before it; the day after the rejected one skips it
    assert [first[d][2] for d in DAYS] == [None, d0, d1, d1]
    again = {day: _run(daily, day) for day in DAYS}  # the backfill run again
    assert again == first
    # a correction of the third day staged later: compared with the second day still
    assert volumes.drift_baseline("cancer", d2, _interval(SHIFTED)[0]) == d1
    # a snapshot given by hand (no interval): the most recently validated one
    assert volumes.drift_baseline("cancer", d2) == d3
    assert volumes.drift_baseline("cancer", d3) is None
