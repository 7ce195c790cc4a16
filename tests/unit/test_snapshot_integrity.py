"""Corruption is never trained on: a damaged shard or an undecodable image fails closed.

A byte flipped in a published shard fails ``volumes.check_snapshot``, the validation step
(before the contract runs) and the training worker (before it reads data), each naming the
snapshot and the shard. An image with a valid header and a garbage body fails validation
naming its sample key and shard.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainyard import volumes
from trainyard.cli import snapshots as snapshots_cli
from trainyard.config import PipelineConfig
from trainyard.errors import SnapshotError, ValidationFailed
from trainyard.staging import stage
from trainyard.validation import validate

ROOT = Path(__file__).resolve().parents[2]

CONTRACT = """\
dataset: pics
version: 1.0.0
owner: tests@example.com
source: {format: image_folder, extension: png}
image: {column: image, height: 8, width: 8, channels: 1}
columns:
  - {name: key, type: string, nullable: false, unique: true}
  - {name: label, type: int64, nullable: false, allowed_values: [0, 1]}
  - {name: shard, type: string}
  - {name: bytes, type: int64}
  - {name: width, type: int64}
  - {name: height, type: int64}
roles: {key: key, label: label, features: [image], num_classes: 2}
split: {holdout_fraction: 0.2, by: key}
"""


@pytest.fixture
def contract(contracts_dir: Path) -> Path:
    folder = contracts_dir
    (folder / "pics.yaml").write_text(CONTRACT)
    return folder / "pics.yaml"


def pipeline(url: Path) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "pics",
            "dataset": "pics",
            "start_date": "2026-11-01",
            "source": {"url": str(url), "format": "image_folder"},
            "training": {"model": "small_cnn"},
            "serving": {"model_name": "pics"},
        }
    )


def png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), "L").save(out, "PNG")
    return out.getvalue()


def raw_images(raw: Path, n: int = 40) -> list[Path]:
    paths = []
    for i in range(n):
        path = raw / str(i % 2) / f"img_{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png(i))
        paths.append(path)
    return paths


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def staged(volume_root: Path, contract: Path, tmp_path: Path) -> Path:
    raw_images(tmp_path / "raw")
    return stage(pipeline(tmp_path / "raw"), quiet=True).path


def test_intact_snapshot_checks_and_validates(staged: Path, tmp_path: Path):
    manifest = volumes.check_snapshot(staged)
    assert manifest.snapshot_id == staged.name
    assert validate(pipeline(tmp_path / "raw"), staged.name).success


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        ("flip", "shard shard-00000.tar: content hash differs from the manifest"),
        ("truncate", "shard shard-00000.tar: 10240 bytes, the manifest lists"),
        ("fifo", "shard shard-00000.tar:"),
        ("link", "shard index.parquet: cannot open"),
    ],
)
def test_damaged_shard_fails_check_and_validation_naming_it(
    staged: Path, tmp_path: Path, damage: str, fragment: str
):
    shard = staged / "shard-00000.tar"
    if damage == "flip":
        flip_byte(shard, 4000)
    elif damage == "truncate":
        os.truncate(shard, 10240)
    elif damage == "fifo":
        shard.unlink()
        os.mkfifo(shard)
    else:
        index = staged / "index.parquet"
        copy = tmp_path / "elsewhere.parquet"
        copy.write_bytes(index.read_bytes())
        index.unlink()
        index.symlink_to(copy)
    with pytest.raises(SnapshotError) as info:
        volumes.check_snapshot(staged)
    assert f"snapshot {staged.name} damaged: {fragment}" in str(info.value)
    with pytest.raises(SnapshotError, match=f"snapshot {staged.name} damaged"):
        validate(pipeline(tmp_path / "raw"), staged.name)
    assert volumes.latest_validated("pics") is None
    assert not (staged / "validation").exists()


def test_manifest_of_another_snapshot_is_damage(staged: Path):
    manifest = json.loads((staged / "manifest.json").read_text())
    manifest["shards"][0]["hash"] = "0" * 64
    (staged / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SnapshotError, match="id does not match its shards"):
        volumes.check_snapshot(staged)


def test_garbage_body_png_fails_validation_naming_key_and_shard(
    volume_root: Path, contract: Path, tmp_path: Path
):
    raw = tmp_path / "raw"
    paths = raw_images(raw)
    good = paths[7].read_bytes()
    # the header (signature + IHDR: 8x8) is kept, everything after it is garbage
    paths[7].write_bytes(good[:33] + bytes(np.random.default_rng(3).integers(0, 255, 200)))
    result = stage(pipeline(raw), quiet=True)
    with pytest.raises(ValidationFailed) as info:
        validate(pipeline(raw), result.snapshot_id)
    message = str(info.value)
    assert "sample '1/img_007' in shard shard-00000.tar" in message
    assert "does not decode" in message
    assert volumes.latest_validated("pics") is None


def test_check_runs_at_hashing_speed(volume_root: Path, tmp_path: Path):
    snap = tmp_path / "snap"
    snap.mkdir()
    data = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
    (snap / "part-00000.parquet").write_bytes(data)
    shard = volumes.ShardInfo(
        "part-00000.parquet", len(data), 1, volumes.hash_file(snap / "part-00000.parquet")
    )
    sid = volumes.compute_snapshot_id("table", "1", [shard])
    manifest = volumes.Manifest(
        sid, "ds", "table", [shard], "blake3", [], "1", {}, None, "2026-11-01", 1, len(data)
    )
    (snap / "manifest.json").write_text(json.dumps(manifest.to_dict()))
    t0 = time.perf_counter()
    volumes.check_snapshot(snap)
    rate = (64 << 20) / (time.perf_counter() - t0)
    assert rate > 200e6, f"{rate / 1e6:.0f} MB/s"


@pytest.mark.slow
def test_training_worker_refuses_a_damaged_snapshot(staged: Path, contract: Path):
    flip_byte(staged / "shard-00000.tar", 4000)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tf_config = {
        "cluster": {"worker": [f"127.0.0.1:{port}"]},
        "task": {"type": "worker", "index": 0},
    }
    out = staged.parent.parent.parent / "run"
    args = ["--snapshot-dir", str(staged), "--contract", str(contract), "--model", "small_cnn",
            "--strategy", "multi_worker_mirrored", "--epochs", "1", "--batch-size", "8",
            "--learning-rate", "0.1", "--checkpoint-dir", str(out / "ck"),
            "--output-dir", str(out / "model")]  # fmt: skip
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT / "plugins"),
        "TF_CONFIG": json.dumps(tf_config),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "trainyard.training.worker", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    from trainyard.training.worker.main import EXIT_BAD_INPUT

    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert f"snapshot {staged.name} damaged: shard shard-00000.tar" in proc.stderr
    assert not (out / "model").exists()


@pytest.mark.parametrize("damage", ["flip", "delete", "symlink"])
def test_staging_the_source_again_repairs_a_damaged_snapshot(
    staged: Path, tmp_path: Path, damage: str
) -> None:
    """Found by a cold user: staging re-read the source, found the same content and kept
    the damaged copy ("reused"), so every later run failed on it for good."""
    shard = staged / "shard-00000.tar"
    if damage == "flip":
        flip_byte(shard, 4000)
    elif damage == "delete":
        shard.unlink()
    else:
        copy = tmp_path / "elsewhere.tar"
        copy.write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(copy)
    with pytest.raises(SnapshotError):
        volumes.check_snapshot(staged)
    again = stage(pipeline(tmp_path / "raw"), quiet=True)
    assert again.path == staged and not again.reused
    assert f"same content as snapshot {staged.name}, whose damaged copy it replaced" in (
        again.checked
    )
    volumes.check_snapshot(staged)
    assert not list((staged.parent.parent / ".tmp").iterdir())
    third = stage(pipeline(tmp_path / "raw"), quiet=True)  # intact now: reused as before
    assert third.reused and "damaged" not in third.checked


def _read_by(reader: str, snapshot: Path, raw: Path) -> None:
    """A reader meets the damaged snapshot (and fails on it, or reports it)."""
    if reader == "verify":
        assert volumes.verify_snapshot(snapshot)
    elif reader == "validate":
        with pytest.raises(SnapshotError, match="damaged"):
            validate(pipeline(raw), snapshot.name, "2026-11-03")
    else:
        with pytest.raises(SnapshotError, match="damaged"):
            volumes.check_snapshot(snapshot)


@pytest.mark.parametrize("reader", ["verify", "validate", "check"])
def test_a_damaged_snapshot_heals_when_its_unchanged_interval_is_staged_again(
    volume_root: Path, contract: Path, tmp_path: Path, capsys, reader: str
) -> None:
    """Found by a new user: after a byte flipped in a shard (same size), ``snapshots
    verify`` said so, but staging the day again saw its source unchanged, reused the
    damaged copy ("listed, not re-read") and every run failed on it, forever. The reader
    that finds the damage records it; the next staging re-reads the source and replaces
    the copy; after that, an unchanged source is listed and not re-read again."""
    raw = tmp_path / "raw"
    raw_images(raw)
    day = ("2026-11-03", "2026-11-04")
    snap = stage(pipeline(raw), *day, quiet=True).path
    flip_byte(snap / "shard-00000.tar", 4000)
    _read_by(reader, snap, raw)
    assert snapshots_cli.cli_main(["list", "pics"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if snap.name in line]
    assert len(listed) == 1 and " DAMAGED: " in listed[0], listed

    again = stage(pipeline(raw), *day, quiet=True)
    assert again.path == snap and not again.reused
    assert "found the interval's snapshot" in again.checked
    assert "whose damaged copy it replaced" in again.checked
    volumes.check_snapshot(snap)
    assert not (snap / volumes.DAMAGED).exists()
    assert not list((snap.parent.parent / ".tmp").iterdir())
    third = stage(pipeline(raw), *day, quiet=True)
    assert third.reused and "listed, not re-read" in third.checked


def test_staging_notices_a_truncated_or_missing_shard_by_its_listing(
    volume_root: Path, contract: Path, tmp_path: Path
) -> None:
    """No reader needed for damage a ``stat`` shows: the reuse path checks each shard's
    type and size (cheap) and re-reads the source when one is off."""
    raw = tmp_path / "raw"
    raw_images(raw)
    day = ("2026-11-03", "2026-11-04")
    snap = stage(pipeline(raw), *day, quiet=True).path
    os.truncate(snap / "shard-00000.tar", 10240)
    again = stage(pipeline(raw), *day, quiet=True)
    assert not again.reused and "whose damaged copy it replaced" in again.checked
    volumes.check_snapshot(snap)


def test_a_stale_damage_record_costs_one_re_read(
    volume_root: Path, contract: Path, tmp_path: Path
) -> None:
    """A record left by a reader racing a repair: the re-read finds the copy intact,
    drops the record, and the next staging reuses without reading."""
    raw = tmp_path / "raw"
    raw_images(raw)
    day = ("2026-11-03", "2026-11-04")
    snap = stage(pipeline(raw), *day, quiet=True).path
    assert volumes.mark_damaged(snap, "a reader's mistake")
    again = stage(pipeline(raw), *day, quiet=True)
    assert again.reused and "a reader found the interval's snapshot" in again.checked
    assert not (snap / volumes.DAMAGED).exists()
    assert "listed, not re-read" in stage(pipeline(raw), *day, quiet=True).checked
