"""Volumes: manifests, verify, mirror, retention, stale temp entries, intervals, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainyard import volumes
from trainyard.errors import SnapshotError
from trainyard.fsutil import HOST, publish_dir


def make_snapshot(root: Path, dataset: str, rows: int, created_at: str) -> str:
    """Publish a small table snapshot the way staging does (real Parquet, real hashes)."""
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
            snapshot_id=sid,
            dataset=dataset,
            kind="table",
            shards=[shard],
            hash_algo="blake3",
            schema=[{"name": "x", "type": "int64", "nullable": True}],
            contract_version="1",
            source={"url": "test"},
            interval=None,
            created_at=created_at,
            rows=rows,
            bytes=shard.bytes,
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest.to_dict()))
        publish_dir(tmp, volumes.snapshot_dir(dataset, sid, root))
    return sid


def register_model(root: Path, pipeline: str, version: int, dataset: str, sid: str) -> None:
    meta = root / "_models" / pipeline / "versions" / str(version) / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"dataset": dataset, "snapshot_id": sid, "version": version}))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard", "snapshots", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=Path(__file__).resolve().parents[2] / "plugins",
        timeout=120,
    )


def test_manifest_round_trip_and_table_files(volume_root: Path):
    sid = make_snapshot(volume_root, "ds", 10, "2026-11-01T00:00:00+00:00")
    snap = volumes.snapshot_dir("ds", sid)
    m = volumes.read_manifest(snap)
    assert volumes.Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert volumes.table_files(snap) == [snap / "part-00000.parquet"]
    assert [x.snapshot_id for x in volumes.list_snapshots("ds")] == [sid]
    assert volumes.list_datasets() == ["ds"]


@pytest.mark.parametrize(
    ("case", "content", "fragment"),
    [
        ("missing", None, "manifest not found"),
        ("not-json", "{oops", "not valid JSON"),
        ("not-object", "[1, 2]", "must be a JSON object"),
        ("missing-field", '{"snapshot_id": "x"}', "manifest is malformed"),
    ],
    ids=["missing", "not-json", "not-object", "missing-field"],
)
def test_read_manifest_errors(tmp_path: Path, case: str, content: str | None, fragment: str):
    if content is not None:
        (tmp_path / "manifest.json").write_text(content)
    with pytest.raises(SnapshotError, match=fragment):
        volumes.read_manifest(tmp_path)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("digits", True),
        ("tx_2", True),
        ("../etc", False),
        ("a/b", False),
        ("", False),
        ("_models", False),
    ],
    ids=["plain", "underscore", "dotdot", "slash", "empty", "reserved"],
)
def test_dataset_names(volume_root: Path, name: str, ok: bool):
    if ok:
        assert volumes.dataset_dir(name) == volume_root / name
    else:
        with pytest.raises(SnapshotError, match="invalid dataset name"):
            volumes.dataset_dir(name)


@pytest.mark.parametrize(
    ("case", "damage", "fragment"),
    [
        (
            "changed",
            lambda s: s.joinpath("part-00000.parquet").write_bytes(
                b"x" * s.joinpath("part-00000.parquet").stat().st_size
            ),
            "content hash differs",
        ),
        ("truncated", lambda s: os.truncate(s / "part-00000.parquet", 10), "size 10 != manifest"),
        ("vanished", lambda s: (s / "part-00000.parquet").unlink(), "part-00000.parquet: missing"),
        ("extra-file", lambda s: (s / "stray.bin").write_bytes(b"1"), "stray.bin: not listed"),
    ],
    ids=["changed", "truncated", "vanished", "extra-file"],
)
def test_verify_names_the_damaged_shard(volume_root: Path, case: str, damage, fragment: str):
    sid = make_snapshot(volume_root, "ds", 100, "2026-11-01T00:00:00+00:00")
    snap = volumes.snapshot_dir("ds", sid)
    assert volumes.verify_snapshot(snap) == []
    assert cli("verify", "ds").returncode == 0
    damage(snap)
    problems = volumes.verify_snapshot(snap)
    assert any(fragment in p for p in problems), problems
    proc = cli("verify", "ds", sid)
    assert proc.returncode == 1 and fragment in proc.stdout


def test_mirror_to_second_volume_root_and_fsspec_url(volume_root: Path, tmp_path: Path):
    sid = make_snapshot(volume_root, "ds", 50, "2026-11-01T00:00:00+00:00")
    second = tmp_path / "second"
    where = volumes.mirror_snapshot("ds", sid, str(second))
    copy = volumes.snapshot_dir("ds", sid, second)
    assert where == str(copy) and volumes.verify_snapshot(copy) == []
    assert not list((second / "ds" / ".tmp").iterdir())
    assert volumes.mirror_snapshot("ds", sid, second.as_uri()) == str(copy)
    url = "memory://bucket/volumes"
    where = volumes.mirror_snapshot("ds", sid, url)
    fs = fsspec.filesystem("memory")
    assert (
        fs.cat_file(f"/bucket/volumes/ds/snapshots/{sid}/part-00000.parquet")
        == (volumes.snapshot_dir("ds", sid) / "part-00000.parquet").read_bytes()
    )
    assert where.startswith("memory://") and where.endswith(sid)
    fs.pipe_file(f"/bucket/volumes/ds/snapshots/{sid}/part-00000.parquet", b"tampered")
    with pytest.raises(SnapshotError, match="does not verify"):
        volumes.mirror_snapshot("ds", sid, url)
    proc = cli("mirror", "ds", sid, str(tmp_path / "third"))
    assert proc.returncode == 0 and "mirrored and verified" in proc.stdout


def test_mirror_refuses_a_damaged_snapshot(volume_root: Path, tmp_path: Path):
    sid = make_snapshot(volume_root, "ds", 50, "2026-11-01T00:00:00+00:00")
    (volumes.snapshot_dir("ds", sid) / "part-00000.parquet").unlink()
    with pytest.raises(SnapshotError, match="will not mirror a damaged snapshot"):
        volumes.mirror_snapshot("ds", sid, str(tmp_path / "second"))
    assert not (tmp_path / "second" / "ds" / "snapshots").exists()


def test_retention_keeps_newest_validated_and_trained(volume_root: Path):
    ids = [
        make_snapshot(volume_root, "ds", 10 + i, f"2026-11-0{i + 1}T00:00:00+00:00")
        for i in range(6)
    ]
    other = make_snapshot(volume_root, "other", 5, "2026-11-01T00:00:00+00:00")
    volumes.mark_validated("ds", ids[1], {"ok": True})
    register_model(volume_root, "digits", 1, "ds", ids[0])
    register_model(volume_root, "other_pipe", 1, "other_ds", ids[2])
    assert volumes.protected_snapshots("ds") == {
        ids[1]: "latest validated",
        ids[0]: "trained _models/digits/versions/1",
    }
    assert volumes.gc_snapshots("ds", 2, dry_run=True) == [ids[2], ids[3]]
    assert len(volumes.list_snapshots("ds")) == 6
    proc = cli("gc", "ds", "--keep", "2")
    assert proc.returncode == 0, proc.stderr
    assert f"deleted 2: {ids[2]}, {ids[3]}" in proc.stdout
    assert [m.snapshot_id for m in volumes.list_snapshots("ds")] == [ids[0], ids[1], ids[4], ids[5]]
    assert [m.snapshot_id for m in volumes.list_snapshots("other")] == [other]
    assert not list((volume_root / "ds" / ".tmp").iterdir())
    with pytest.raises(SnapshotError, match="at least 1"):
        volumes.gc_snapshots("ds", 0)


def test_retention_refuses_on_unreadable_model_metadata(volume_root: Path):
    make_snapshot(volume_root, "ds", 1, "2026-11-01T00:00:00+00:00")
    meta = volume_root / "_models" / "p" / "versions" / "1" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text("{broken")
    with pytest.raises(SnapshotError, match="refusing to garbage-collect"):
        volumes.gc_snapshots("ds", 1)


def test_mark_validated_history(volume_root: Path):
    a = make_snapshot(volume_root, "ds", 1, "2026-11-01T00:00:00+00:00")
    b = make_snapshot(volume_root, "ds", 2, "2026-11-02T00:00:00+00:00")
    assert volumes.latest_validated("ds") is None
    volumes.mark_validated("ds", a, {"n": 1})
    volumes.mark_validated("ds", b, {"n": 2})
    data = json.loads((volume_root / "ds" / "validated.json").read_text())
    assert data["snapshot_id"] == b == volumes.latest_validated("ds")
    assert [h["snapshot_id"] for h in data["history"]] == [a, b]
    with pytest.raises(SnapshotError, match="no such snapshot"):
        volumes.mark_validated("ds", "0" * 16, {})


def test_stale_tmp_of_dead_pids_is_cleaned(volume_root: Path):
    tmp = volume_root / "ds" / ".tmp"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = HOST
        names = {
            "dead": f"stage-{host}-{dead.pid}-aaaaaaaaaaaa",
            "alive": f"stage-{host}-{alive.pid}-bbbbbbbbbbbb",
            "mine": f"stage-{host}-{os.getpid()}-cccccccccccc",
            "foreign-fresh": f"stage-otherhost-{dead.pid}-dddddddddddd",
        }
        for name in names.values():
            (tmp / name).mkdir(parents=True)
            (tmp / name / "part-00000.parquet").write_bytes(b"partial")
        old = tmp / f"stage-otherhost-{dead.pid}-eeeeeeeeeeee"
        old.mkdir()
        os.utime(old, (1, 1))
        removed = volumes.clean_stale_tmp("ds")
        assert sorted(removed) == sorted([names["dead"], old.name])
        assert sorted(p.name for p in tmp.iterdir()) == sorted(
            [names["alive"], names["mine"], names["foreign-fresh"]]
        )
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize(
    ("start", "end", "key"),
    [
        (None, None, None),
        ("2026-11-01", "2026-11-02", "2026-11-01T000000+0000__2026-11-02T000000+0000"),
        (
            "2026-11-01T00:00:00+00:00",
            "2026-11-02T00:00:00+00:00",
            "2026-11-01T000000+0000__2026-11-02T000000+0000",
        ),
        (
            "2026-11-01T02:00:00+02:00",
            "2026-11-02 00:00:00",
            "2026-11-01T000000+0000__2026-11-02T000000+0000",
        ),
        (
            "2026-11-26T23:09:15.109949+00:00",
            None,
            "2026-11-26T230915_109949+0000__open",
        ),
        ("../../x", "y/z", "____x__yz"),
    ],
    ids=["none", "dates", "datetimes", "offset", "microseconds", "traversal"],
)
def test_interval_keys(start: str | None, end: str | None, key: str | None):
    """A date and the date-time of its midnight (in any offset) are one interval: found
    by a cold user, a step run by hand with ``--interval-start 2026-11-20`` and Airflow's
    run of that day made two interval records."""
    assert volumes.interval_key(start, end) == key


def test_record_interval_never_overwrites(volume_root: Path):
    first = volumes.record_interval("ds", "k", {"snapshot_id": "a" * 16})
    second = volumes.record_interval("ds", "k", {"snapshot_id": "b" * 16})
    assert first == second == {"snapshot_id": "a" * 16}
    assert volumes.read_interval("ds", "k") == {"snapshot_id": "a" * 16}
    volumes.record_interval("ds", "k", {"snapshot_id": "c" * 16}, overwrite=True)
    assert volumes.read_interval("ds", "k")["snapshot_id"] == "c" * 16
    assert sorted(p.name for p in (volume_root / "ds" / "intervals").iterdir()) == ["k.json"]


def test_cli_list_and_show(volume_root: Path):
    sid = make_snapshot(volume_root, "ds", 3, "2026-11-01T00:00:00+00:00")
    volumes.mark_validated("ds", sid, {})
    proc = cli("list")
    assert proc.returncode == 0 and sid in proc.stdout and "*last validated" in proc.stdout
    shown = json.loads(cli("show", "ds", sid).stdout)
    assert shown["snapshot_id"] == sid and shown["rows"] == 3
    bad = cli("show", "ds", "nothex")
    assert bad.returncode == 3 and "invalid snapshot id" in bad.stderr


def test_cli_list_of_an_unknown_dataset_is_an_error_that_names_the_known_ones(volume_root: Path):
    make_snapshot(volume_root, "ds", 3, "2026-11-01T00:00:00+00:00")
    bad = cli("list", "nosuch")
    assert bad.returncode == 3 and "unknown dataset 'nosuch'" in bad.stderr
    assert "ds" in bad.stderr and "digits" in bad.stderr  # volumes and contracts
    empty = cli("list", "digits")  # a contract, nothing staged yet: a state, not an error
    assert empty.returncode == 0 and "digits: no snapshots yet" in empty.stdout
