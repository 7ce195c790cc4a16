"""tf.data pipelines over real shards: per-worker sharding covers every example once."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

from tests.support.trainer import (
    DIGITS_CONTRACT,
    make_files_snapshot,
    make_table_snapshot,
    write_table_contract,
)
from trainyard.contracts import parse_contract as read_contract
from trainyard.training.worker.data import load_examples
from trainyard.training.worker.input import SnapshotInput, _decode_jpeg_at_least


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


def _jpg_contract(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "jpg" / "digits.yaml"
    path.parent.mkdir()
    path.write_text(DIGITS_CONTRACT.read_text().replace("extension: png", "extension: jpg"))
    return read_contract(path)


def _images(ds) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.concatenate([np.asarray(x["image"]) for x, _ in ds])


@pytest.mark.parametrize("ext", ["png", "jpg"], ids=["png-crop-after-decode", "jpeg-crop-decode"])
def test_augment_is_random_and_evaluation_is_deterministic(tmp_path: Path, ext: str) -> None:
    snap = make_files_snapshot(tmp_path / "s", n=96, shards=2, ext=ext)
    contract = _jpg_contract(tmp_path) if ext == "jpg" else read_contract(DIGITS_CONTRACT)
    inp = SnapshotInput(snap, contract, "all", resize=True)

    def passes(augment: bool) -> list[np.ndarray]:
        kw = {"shuffle": False, "repeat": False, "augment": augment}
        return [_images(inp.dataset(16, **kw)) for _ in range(2)]

    evals = passes(augment=False)
    np.testing.assert_array_equal(evals[0], evals[1])
    train = passes(augment=True)
    assert train[0].shape == evals[0].shape == (96, 8, 8, 1)
    assert train[0].min() >= 0.0 and train[0].max() <= 1.0
    assert not np.array_equal(train[0], train[1])  # a new crop and flip every pass
    assert not np.array_equal(train[0], evals[0])


@pytest.mark.parametrize(
    ("resize", "cache"),
    [(False, None), (True, "memory")],
    ids=["without-resize", "with-cache"],
)
def test_augment_refuses_pipelines_it_cannot_serve(
    tmp_path: Path, resize: bool, cache: str | None
) -> None:
    from trainyard.errors import TrainingError

    snap = make_files_snapshot(tmp_path / "s", n=40, shards=1)
    inp = SnapshotInput(snap, read_contract(DIGITS_CONTRACT), "all", cache=cache, resize=resize)
    with pytest.raises(TrainingError, match="augment needs"):
        inp.dataset(8, augment=True)


def test_jpeg_crop_window_decoded_at_a_dct_scale() -> None:
    from PIL import Image

    from trainyard.training.worker.input import _decode_jpeg_random_crop

    buf = io.BytesIO()
    Image.fromarray(np.full((1800, 2400, 3), 90, np.uint8)).save(buf, format="JPEG")
    data = tf.constant(buf.getvalue())
    shapes = set()
    for _ in range(20):
        image = _decode_jpeg_random_crop(data, 224, 224, 3, seed=7)
        h, w = image.shape[:2]
        shapes.add((h, w))
        # Windows of 448+ pixels a side are decoded at 1/2..1/8: never 2x the target left.
        assert min(h // 224, w // 224) < 2 and h >= 1 and w >= 1
        assert abs(float(tf.reduce_mean(tf.cast(image, tf.float32))) - 90) < 3
    assert len(shapes) > 1  # random windows
