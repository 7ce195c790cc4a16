"""A staging run killed with SIGKILL mid-write leaves nothing visible; the next run succeeds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainyard import volumes
from trainyard.config import PipelineConfig
from trainyard.staging import stage

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
CONTRACT = """\
dataset: big
version: 1.0.0
owner: tests@example.com
source: {format: csv}
roles: {key: name, label: id, features: [value], num_classes: 2}
split: {holdout_fraction: 0.2, by: name}
columns:
  - {name: id, type: int64}
  - {name: name, type: string}
  - {name: value, type: float64}
"""


def pipeline(src: Path) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "big",
            "dataset": "big",
            "start_date": "2026-11-01",
            "source": {"url": str(src), "format": "csv"},
            "staging": {"shard_target_mb": 4, "row_group_rows": 20_000},
            "training": {"model": "mlp"},
            "serving": {"model_name": "big"},
        }
    )


@pytest.mark.slow
def test_sigkill_mid_staging_then_rerun(
    volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "big.yaml").write_text(CONTRACT)
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(contracts))
    src = tmp_path / "big.csv"
    with src.open("w") as fh:
        fh.write("id,name,value\n")
        for i in range(1_500_000):
            fh.write(f"{i},name-{i % 1000}-{i * 7919 % 100003},{i * 0.37:.3f}\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(PLUGINS)!r})
        from trainyard.config import PipelineConfig
        from trainyard.staging import stage
        stage(PipelineConfig.model_validate_json({pipeline(src).model_dump_json()!r}),
              "2026-11-01", "2026-11-02", quiet=True)
        """
    )
    tmp_area = volume_root / "big" / ".tmp"
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        killed_mid_write = False
        while time.monotonic() < deadline and proc.poll() is None:
            shards = list(tmp_area.glob("stage-*/part-*.parquet")) if tmp_area.exists() else []
            if len(shards) >= 2:
                os.kill(proc.pid, signal.SIGKILL)
                killed_mid_write = True
                break
            time.sleep(0.01)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed_mid_write, "staging finished before it could be killed; grow the input"
    assert proc.returncode == -signal.SIGKILL
    residue = list(tmp_area.iterdir())
    assert residue and all(p.name.startswith("stage-") for p in residue)
    assert not (volume_root / "big" / "snapshots").exists() or not list(
        (volume_root / "big" / "snapshots").iterdir()
    )
    assert volumes.list_snapshots("big") == []
    assert not (volume_root / "big" / "intervals").exists()

    result = stage(pipeline(src), "2026-11-01", "2026-11-02", quiet=True)
    assert not result.reused and result.rows == 1_500_000
    assert list(tmp_area.iterdir()) == []
    assert volumes.verify_snapshot(result.path) == []
    assert [m.snapshot_id for m in volumes.list_snapshots("big")] == [result.snapshot_id]
    again = stage(pipeline(src), "2026-11-01", "2026-11-02", quiet=True)
    assert again.reused and again.snapshot_id == result.snapshot_id
