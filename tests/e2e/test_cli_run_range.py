"""``python -m trainyard run --ds D --end-ds D'`` does what the DAG runs of those days do.

A dataset the project does not ship (scikit-learn's breast cancer split into daily CSV
files, generated here), backfilled from the CLI over 3 days: every day is staged and
validated as its DAG run would (same cron data interval), only the last trains
(``backfill_training: last``), on the whole window (3 snapshots, every row).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

from tests.support.daily_csv import pipeline as pipeline_dict
from tests.support.daily_csv import use_contracts, write_days
from tests.support.harness import make_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]


def test_a_cli_backfill_trains_once_on_the_whole_window(tmp_path) -> None:
    proj = make_project(tmp_path)
    raw = tmp_path / "raw"
    rows = write_days(raw, DAYS)
    use_contracts(proj.env, tmp_path / "contracts")
    cfg = pipeline_dict(
        raw,
        training={"window": {"intervals": 30}, "epochs": 2, "workers": 1},
        gate={"metrics": ["accuracy", "loss"], "thresholds": {"accuracy": {"min": 0.5}}},
        serving={"model_name": "cancer", "port": proj.port},
    )
    (tmp_path / "pipelines" / "cancer.yaml").write_text(yaml.safe_dump(cfg))
    try:
        out = proj.trainyard(
            "run", "--pipeline", "cancer", "--ds", DAYS[0], "--end-ds", DAYS[-1], timeout=1100
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        records = sorted((proj.volume_root / "cancer" / "intervals").glob("*.json"))
        # one interval per day of the cron (03:00 to 03:00), named by its days as the DAG's
        # runs name theirs (found by a cold user: the two made two records of one day)
        assert [p.name[:10] for p in records] == DAYS
        first = json.loads(records[0].read_text())
        assert (first["start"], first["end"]) == (DAYS[0], DAYS[1])
        versions = sorted((proj.volume_root / "_models" / "cancer" / "versions").iterdir())
        assert [v.name for v in versions] == ["1"]  # only the last day trained
        meta = json.loads((versions[0] / "metadata.json").read_text())
        assert len(meta["snapshots"]) == 3
        assert meta["rows"] > max(rows.values())
        assert "served" in out.stdout
        # the contract's class names are served beside the ids
        assert "'malignant'" in out.stdout or "'benign'" in out.stdout, out.stdout
        assert json.loads((versions[0] / "metrics.json").read_text())["class_names"] == [
            "malignant",
            "benign",
        ]
    finally:
        proj.stop_server()


def test_bad_ranges_are_refused_before_anything_runs(tmp_path) -> None:
    proj = make_project(tmp_path)
    out = proj.trainyard(
        "run", "--pipeline", "digits", "--ds", "2026-11-03", "--end-ds", "2026-11-01"
    )
    assert out.returncode != 0 and "--end-ds 2026-11-01 is before --ds 2026-11-03" in out.stderr
    out = proj.trainyard("run", "--pipeline", "digits", "--end-ds", "2026-11-01")
    assert out.returncode == 2 and "--end-ds needs --ds" in out.stderr
    out = proj.trainyard("run", "--pipeline", "digits", "--ds", "yesterday")
    assert out.returncode == 2 and "--ds" in out.stderr
    out = proj.trainyard("run", "--pipeline", "digits", "--overrides", "[1]")  # was a traceback
    assert out.returncode == 2 and "--overrides: expected a JSON object, got [1]" in out.stderr
    # a future day would train on data that cannot exist yet (the bootstrap makes some up)
    # and become a champion no real run could beat; before start_date is no interval
    tomorrow = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)).isoformat()
    out = proj.trainyard("run", "--pipeline", "digits", "--ds", tomorrow)
    assert out.returncode == 2 and f"--ds {tomorrow} is after today" in out.stderr
    out = proj.trainyard("run", "--pipeline", "digits", "--ds", "2026-10-01")
    assert out.returncode == 2
    assert "--ds 2026-10-01 is before the pipeline's start_date 2026-11-01" in out.stderr
    today = dt.datetime.now(dt.UTC).date().isoformat()  # its interval has not ended
    out = proj.trainyard("run", "--pipeline", "digits", "--ds", today)
    assert out.returncode == 2 and "has not ended, so its data is not complete" in out.stderr
    assert not (proj.volume_root / "digits").exists()
