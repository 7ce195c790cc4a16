"""load_examples and the shard index over real tar / Parquet snapshots (no TensorFlow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.trainer import (
    DIGITS_CONTRACT,
    digits_arrays,
    make_files_snapshot,
    make_table_snapshot,
    write_table_contract,
)
from trainyard.contracts import holdout_mask
from trainyard.contracts import parse_contract as read_contract
from trainyard.errors import SnapshotError
from trainyard.training.worker.data import load_examples


@pytest.mark.parametrize(
    ("split", "expect_holdout"), [("train", False), ("holdout", True)], ids=["train", "holdout"]
)
def test_files_split_matches_holdout_mask_and_pixels(
    tmp_path: Path, split: str, expect_holdout: bool
) -> None:
    images, labels = digits_arrays(300)
    snap = make_files_snapshot(tmp_path / "s", images=images, labels=labels, shards=3)
    ex = load_examples(snap, read_contract(DIGITS_CONTRACT), split)  # type: ignore[arg-type]
    every = load_examples(snap, read_contract(DIGITS_CONTRACT), "all")
    assert len(every) == 300
    assert np.all(holdout_mask(ex.keys, 0.2) == expect_holdout)
    rows = [every.keys.index(k) for k in ex.keys]
    np.testing.assert_allclose(ex.features["image"][:, :, :, 0], images[rows] / 255.0, rtol=1e-6)
    assert ex.features["image"].dtype == np.float32
    assert ex.labels.tolist() == labels[rows].tolist()


def test_table_split(tmp_path: Path) -> None:
    snap = make_table_snapshot(tmp_path / "s", n=300, parts=2)
    contract = read_contract(write_table_contract(tmp_path))
    train = load_examples(snap, contract, "train")
    hold = load_examples(snap, contract, "holdout")
    assert len(train) + len(hold) == 300 and not set(train.keys) & set(hold.keys)
    assert sorted(train.features) == ["x1", "x2", "x3"] and train.features["x1"].dtype == np.float32


def _corrupt_member(snap: Path) -> None:
    shard = snap / "shard-00000.tar"
    data = bytearray(shard.read_bytes())
    start = data.index(b"\x89PNG")
    data[start : start + 8] = b"garbage!"
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda s: (s / "manifest.json").unlink(), r"manifest.json: manifest not found"),
        (
            lambda s: (s / "shard-00001.tar").unlink(),
            r"shard-00001.tar: shard listed in the manifest is missing",
        ),
        (lambda s: (s / "index.parquet").unlink(), r"index.parquet: index not found"),
        (_corrupt_member, r"shard-00000.tar key '0/img_000000': not a decodable image"),
    ],
    ids=["no-manifest", "missing-shard", "missing-index", "corrupt-image"],
)
def test_broken_snapshot_is_one_clear_error(tmp_path: Path, breakage, message: str) -> None:  # type: ignore[no-untyped-def]
    snap = make_files_snapshot(tmp_path / "s", n=40, shards=2)
    breakage(snap)
    with pytest.raises(SnapshotError, match=message):
        load_examples(snap, read_contract(DIGITS_CONTRACT), "all")


def test_data_module_imports_no_tensorflow() -> None:
    code = (
        "import sys; import trainyard.training.worker.data, trainyard.training; "
        "print('tensorflow' in sys.modules)"
    )
    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": plugins},
        check=True,
    )
    assert out.stdout.strip() == "False"
