"""tf.data pipelines over real shards: per-worker sharding covers every example once."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_fixtures import (
    DIGITS_CONTRACT,
    make_files_snapshot,
    make_table_snapshot,
    write_table_contract,
)

from trainyard.trainer.data import load_examples, read_contract

tf = pytest.importorskip("tensorflow")
from trainyard.trainer.input import SnapshotInput, _decode_jpeg_at_least  # noqa: E402


def _rows(ds, names: list[str]) -> list[tuple]:  # type: ignore[no-untyped-def]
    out = []
    for x, y in ds:
        cols = [np.asarray(x[n]).reshape(len(y), -1) for n in names]
        flat = np.concatenate(cols, axis=1)
        out += [
            (int(label), *np.round(row, 5).tolist())
            for label, row in zip(np.asarray(y), flat, strict=True)
        ]
    return sorted(out)


def _expected(ex, names: list[str]) -> list[tuple]:  # type: ignore[no-untyped-def]
    flat = np.concatenate([ex.features[n].reshape(len(ex), -1) for n in names], axis=1)
    return sorted(
        (int(lb), *np.round(r, 5).tolist()) for lb, r in zip(ex.labels, flat, strict=True)
    )


@pytest.mark.parametrize(
    ("kind", "shards", "pipelines", "in_graph"),
    [
        ("files", 4, 2, False),
        ("files", 1, 2, False),
        ("files", 3, 1, False),
        ("table", 4, 2, False),
        ("table", 1, 3, False),
        ("table", 2, 2, True),
    ],
    ids=["tar-shard-per-worker", "tar-element-stride", "tar-one-worker", "parquet-file-per-worker",
         "parquet-element-stride", "parquet-in-graph-for-ps"],
)  # fmt: skip
def test_pipelines_partition_the_split(
    tmp_path: Path, kind: str, shards: int, pipelines: int, in_graph: bool
) -> None:
    if kind == "files":
        snap = make_files_snapshot(tmp_path / "s", n=120, shards=shards)
        contract = read_contract(DIGITS_CONTRACT)
        names = ["image"]
    else:
        snap = make_table_snapshot(tmp_path / "s", n=150, parts=shards)
        contract = read_contract(write_table_contract(tmp_path))
        names = ["x1", "x2", "x3"]
    inp = SnapshotInput(snap, contract, "train", in_graph=in_graph)
    expected = _expected(load_examples(snap, contract, "train"), names)
    assert inp.spec.num_examples == len(expected)
    got: list[tuple] = []
    for pid in range(pipelines):
        ds = inp.dataset(16, pipelines, pid, shuffle=False, repeat=False, drop_remainder=False)
        part = _rows(ds, names)
        assert 0 < len(part) < len(expected) or pipelines == 1
        got += part
    assert sorted(got) == expected


def test_training_batches_have_static_shapes_and_repeat(tmp_path: Path) -> None:
    snap = make_files_snapshot(tmp_path / "s", n=100, shards=2)
    inp = SnapshotInput(
        snap, read_contract(DIGITS_CONTRACT), "train", cache=str(tmp_path / "cache")
    )
    ds = inp.dataset(32, seed=1)
    assert ds.element_spec[0]["image"].shape.as_list() == [32, 8, 8, 1]
    batches = list(ds.take(2 * inp.spec.num_examples // 32 + 1))  # more than one pass
    assert all(b[0]["image"].shape == (32, 8, 8, 1) for b in batches)
    assert list((tmp_path / "cache").iterdir())  # the local cache was written


@pytest.mark.parametrize(
    ("size", "expected"),
    [((300, 400), (300, 400)), ((460, 470), (230, 235)), ((900, 1000), (225, 250))],
    ids=["full-scale", "half-scale", "quarter-scale"],
)
def test_jpeg_decoded_at_the_smallest_scale_still_covering_the_target(
    size: tuple[int, int], expected: tuple[int, int]
) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((*size, 3), 120, np.uint8)).save(buf, format="JPEG")
    image = _decode_jpeg_at_least(tf.constant(buf.getvalue()), 224, 224, 3)
    assert tuple(image.shape[:2]) == expected
    assert abs(float(tf.reduce_mean(tf.cast(image, tf.float32))) - 120) < 3
