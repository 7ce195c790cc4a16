"""Interval records an older trainyard keyed by day still count once, under the new key.

Before interval keys were UTC instants, ``trainyard run --ds 2026-11-02`` recorded its day
as ``2026-11-02__2026-11-03.json``, and Airflow's run of that day as
``2026-11-02T000000+0000__2026-11-03T000000+0000.json``. After an upgrade, staging the day
again found no record under the new key (so it did not reuse or correct the old one), and
a training window counted the day twice, once per record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.daily_csv import contract, days, write_days
from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard import volumes
from trainyard.config import PipelineConfig
from trainyard.staging import stage
from trainyard.validation import validate

DAYS = days("2026-11-01", 5)


@pytest.fixture
def cfg(tmp_path: Path, volume_root: Path, monkeypatch: pytest.MonkeyPatch) -> PipelineConfig:
    raw = tmp_path / "raw"
    write_days(raw, DAYS)
    (tmp_path / "contracts").mkdir()
    doc = yaml.safe_dump(contract(), sort_keys=False)
    (tmp_path / "contracts" / "cancer.yaml").write_text(doc)
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(tmp_path / "contracts"))
    return PipelineConfig.model_validate(pipeline_dict(raw))


def _day(cfg: PipelineConfig, i: int) -> str:
    """Stage and validate ``DAYS[i]`` as ``trainyard run --ds`` does; its snapshot."""
    sid = stage(cfg, DAYS[i], DAYS[i + 1], quiet=True).snapshot_id
    validate(cfg, sid, DAYS[i])
    return sid


def _records(volume_root: Path) -> list[str]:
    return sorted(p.name for p in (volume_root / "cancer" / "intervals").glob("*.json"))


def _as_older_trainyard(volume_root: Path, i: int) -> Path:
    """Rename ``DAYS[i]``'s record to the key an older trainyard gave a day."""
    folder = volume_root / "cancer" / "intervals"
    new = folder / f"{volumes.interval_key(DAYS[i], DAYS[i + 1])}.json"
    old = folder / f"{DAYS[i]}__{DAYS[i + 1]}.json"
    new.rename(old)
    return old


def test_staging_a_day_again_adopts_its_older_record(
    cfg: PipelineConfig, volume_root: Path
) -> None:
    sid = _day(cfg, 0)
    _as_older_trainyard(volume_root, 0)
    snapshots = sorted(p.name for p in (volume_root / "cancer" / "snapshots").iterdir())

    # Airflow's run of the same day: its date-times, the same interval
    again = stage(cfg, f"{DAYS[0]}T00:00:00+00:00", f"{DAYS[1]}T00:00:00+00:00", quiet=True)

    assert again.snapshot_id == sid
    assert sorted(p.name for p in (volume_root / "cancer" / "snapshots").iterdir()) == snapshots
    assert _records(volume_root) == [f"{volumes.interval_key(DAYS[0], DAYS[1])}.json"]


def test_a_day_recorded_under_both_keys_counts_once(cfg: PipelineConfig, volume_root: Path) -> None:
    sids = [_day(cfg, i) for i in range(4)]
    # the second day was recorded by an older trainyard, pointing at another snapshot,
    # and recorded again since under the new key
    older = _as_older_trainyard(volume_root, 1)
    record = json.loads(older.read_text())
    shutil.copy(older, older.with_name(f"{volumes.interval_key(DAYS[1], DAYS[2])}.json"))
    older.write_text(json.dumps({**record, "snapshot_id": sids[3]}))

    window = volumes.training_window("cancer", {"intervals": 4}, sids[2], DAYS[2])

    assert [e["snapshot_id"] for e in window] == sids[:3]
    assert volumes.drift_baseline("cancer", sids[3], DAYS[3]) == sids[2]
