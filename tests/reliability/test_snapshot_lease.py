"""Retention never deletes a snapshot a reader holds (``volumes.lease_snapshot``).

A reader in another process leases the oldest snapshot; ``snapshots gc --keep 1`` and a
stage's own retention keep it while the reader lives, and delete it once the reader is
killed -9 (its lease dies with its pid on this host) or its lease of another host expires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainyard import volumes
from trainyard.errors import SnapshotError
from trainyard.fsutil import publish_dir

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

HOLDER = """
import sys, time
from trainyard import volumes
with volumes.lease_snapshot(sys.argv[1], sys.argv[2], purpose="train run-1", ttl_s=3):
    print("held", flush=True)
    time.sleep(600)
"""


def make_snapshot(root: Path, dataset: str, rows: int, created_at: str) -> str:
    with volumes.staging_area(dataset, "test", root) as tmp:
        pq.write_table(pa.table({"x": list(range(rows))}), tmp / "part-00000.parquet")
        shard = volumes.ShardInfo(
            "part-00000.parquet",
            (tmp / "part-00000.parquet").stat().st_size,
            rows,
            volumes.hash_file(tmp / "part-00000.parquet"),
        )
        sid = volumes.compute_snapshot_id("table", "1", [shard])
        manifest = volumes.Manifest(
            sid, dataset, "table", [shard], "blake3", [], "1", {}, None, created_at, rows, 1
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest.to_dict()))
        publish_dir(tmp, volumes.snapshot_dir(dataset, sid, root))
    return sid


def snapshots(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "ds" / "snapshots").iterdir())


def gc_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard", "snapshots", "gc", "ds", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=PLUGINS,
        timeout=120,
    )


def test_gc_keeps_a_snapshot_a_live_reader_holds(volume_root: Path):
    ids = [make_snapshot(volume_root, "ds", 3 + i, f"2026-11-0{i + 1}T00") for i in range(3)]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "ds", ids[0]],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
        cwd=PLUGINS,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # the lease is renewed every ttl/3: it outlives its first expiry while the reader lives
        time.sleep(4)
        proc = gc_cli("--keep", "1")
        assert proc.returncode == 0, proc.stderr
        assert f"deleted 1: {ids[1]}" in proc.stdout
        assert f"ds/{ids[0]}: leased by train run-1 (pid {holder.pid}" in proc.stdout
        assert snapshots(volume_root) == sorted([ids[0], ids[2]])
        assert volumes.check_snapshot(volumes.snapshot_dir("ds", ids[0]))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    proc = gc_cli("--keep", "1")
    assert f"deleted 1: {ids[0]}" in proc.stdout
    assert snapshots(volume_root) == [ids[2]]
    assert not list((volume_root / "ds" / "leases").iterdir())


def test_lease_is_released_and_refused_for_a_missing_snapshot(volume_root: Path):
    a = make_snapshot(volume_root, "ds", 3, "2026-11-01T00")
    b = make_snapshot(volume_root, "ds", 4, "2026-11-02T00")
    with volumes.lease_snapshot("ds", a, purpose="validate") as path:
        assert path == volumes.snapshot_dir("ds", a)
        assert volumes.gc_snapshots("ds", 1) == []
        assert set(volumes.active_leases("ds")) == {a}
    assert volumes.active_leases("ds") == {}
    assert volumes.gc_snapshots("ds", 1) == [a]
    with (
        pytest.raises(SnapshotError, match=f"cannot lease snapshot {a} for train"),
        volumes.lease_snapshot("ds", a, purpose="train"),
    ):
        pass
    assert snapshots(volume_root) == [b]


def test_lease_of_another_host_holds_until_it_expires(volume_root: Path):
    a = make_snapshot(volume_root, "ds", 3, "2026-11-01T00")
    make_snapshot(volume_root, "ds", 4, "2026-11-02T00")
    lease = volume_root / "ds" / "leases" / f"{a}--otherpod-1-abc.json"
    lease.parent.mkdir(parents=True)
    record = {"pid": 1, "host": "otherpod", "purpose": "train", "expires_at": time.time() + 60}
    lease.write_text(json.dumps(record))
    assert volumes.gc_snapshots("ds", 1) == []
    lease.write_text(json.dumps({**record, "expires_at": time.time() - 1}))
    assert volumes.gc_snapshots("ds", 1) == [a]
    assert not lease.exists()


def test_a_stages_own_retention_keeps_a_leased_snapshot(
    volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from trainyard.config import PipelineConfig
    from trainyard.staging import stage

    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "ds.yaml").write_text(
        "dataset: ds\nversion: 1.0.0\nowner: t@example.com\nsource: {format: csv}\n"
        "roles: {key: id, label: y, features: [x], num_classes: 2}\n"
        "split: {holdout_fraction: 0.2, by: id}\n"
        "columns:\n  - {name: id, type: string}\n  - {name: x, type: float64}\n"
        "  - {name: y, type: int64}\n"
    )
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(contracts))

    def stage_day(day: int) -> str:
        src = tmp_path / f"d{day}.csv"
        src.write_text("id,x,y\n" + "".join(f"{day}-{i},{i}.5,{i % 2}\n" for i in range(20)))
        config = PipelineConfig.model_validate(
            {
                "name": "ds",
                "dataset": "ds",
                "start_date": "2026-11-01",
                "source": {"url": str(src), "format": "csv"},
                "staging": {"retention": 1},
                "training": {"model": "mlp"},
                "serving": {"model_name": "ds"},
            }
        )
        return stage(config, quiet=True).snapshot_id

    first = stage_day(0)
    with volumes.lease_snapshot("ds", first, purpose="train run-1"):
        second = stage_day(1)
        third = stage_day(2)
        assert snapshots(volume_root) == sorted([first, third])
        assert second not in snapshots(volume_root)
        volumes.check_snapshot(volumes.snapshot_dir("ds", first))
    assert stage_day(3) not in (first, third)
    assert first not in snapshots(volume_root)
