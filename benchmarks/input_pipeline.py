"""Examples/s of our tf.data input pipelines vs tf.data.TFRecordDataset of the same examples.

``--case images`` (the default): both read the same PNG examples (a files snapshot and
TFRecord files of tf.train.Example with the same bytes and labels, same shard count) and end
in the same batched tensors: ({"image": float32 (B, H, W, C) in [0, 1]}, int64 (B,)).

``--case table``: a churn-like table (``data_contracts/churn.yaml``: numbers with a few
percent missing, string categories, one with a long tail, an integer code) as Parquet
shards of a table snapshot and as TFRecord files of tf.train.Example (a missing number is
NaN, a missing category ``""``). Both end in the same preprocessed batches, the model's
encoded input (float32 (B, D)) and int64 labels, built by the same Keras preprocessing
layers of the same statistics (imputation, scaling, buckets, vocabulary lookups): ours
reads Arrow record batches and preprocesses a whole batch per call, as the model does in
training; the baseline is the plain idiom, ``parse_single_example`` and the preprocessing
in a ``map`` per example, then ``batch``. ``ratio_vs_batched`` compares ours with a tuned
TFRecord pipeline too: ``batch`` first, then ``parse_example`` and the preprocessing per
batch.

Each of ``--repeats`` rounds times one pass of each (alternating, on the same shared
host); the ratios printed are the median of the rounds, with their range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import tensorflow as tf  # noqa: E402

from tests.support.trainer import (  # noqa: E402
    DIGITS_CONTRACT,
    _manifest,
    digits_arrays,
    make_files_snapshot,
)
from trainyard.contracts import parse_contract as read_contract  # noqa: E402
from trainyard.training.worker.data import file_index  # noqa: E402
from trainyard.training.worker.input import SnapshotInput  # noqa: E402


def write_tfrecords(snap: Path, out: Path) -> list[str]:
    index = file_index(snap, read_contract(DIGITS_CONTRACT))
    paths = []
    for s, shard in enumerate(index.shards):
        path = out / f"shard-{s:05d}.tfrecord"
        blob = shard.read_bytes()
        with tf.io.TFRecordWriter(str(path)) as w:
            for r in (index.shard == s).nonzero()[0]:
                data = blob[index.offset[r] : index.offset[r] + index.size[r]]
                label = tf.train.Int64List(value=[int(index.labels[r])])
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "label": tf.train.Feature(int64_list=label),
                }
                ex = tf.train.Example(features=tf.train.Features(feature=feature))
                w.write(ex.SerializeToString())
        paths.append(str(path))
    return paths


def baseline_dataset(paths: list[str], batch: int) -> tf.data.Dataset:
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        ex = tf.io.parse_single_example(record, spec)
        image = tf.ensure_shape(
            tf.io.decode_image(ex["image"], channels=1, expand_animations=False), (8, 8, 1)
        )
        return {"image": tf.cast(image, tf.float32) / 255.0}, ex["label"]

    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE
    )


def one_pass(make) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Examples per second of wall time and per CPU-second (tf.data's threads included)."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    for x, y in make():
        assert all(v.dtype == tf.float32 for v in x.values()) and y.dtype == tf.int64
        n += int(y.shape[0])
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def rounds(ours, base, repeats: int, other=None) -> list[tuple[float, ...]]:  # type: ignore[no-untyped-def]
    """Per round: ours and the baseline's examples/s (wall), then per CPU-second; with
    ``other``, its examples/s (wall, CPU) last."""
    one_pass(ours), one_pass(base)  # warm the page cache and tf.data
    if other is not None:
        one_pass(other)
    out = []
    for _ in range(repeats):
        o, b = one_pass(ours), one_pass(base)
        extra = one_pass(other) if other is not None else ()
        out.append((o[0], b[0], o[1], b[1], *extra))
    return out


def report(name: str, measured: list[tuple[float, ...]]) -> str:
    """The BENCH line: median ratios of the rounds (wall, CPU), their range, the rates."""
    ratios = [m[0] / m[1] for m in measured]
    cpu = [m[2] / m[3] for m in measured]
    ours = statistics.median(m[0] for m in measured)
    base = statistics.median(m[1] for m in measured)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    line = (
        f"BENCH {name} ratio={statistics.median(ratios):.3f} ours={ours:.0f} baseline={base:.0f} "
        f"cpu_ratio={statistics.median(cpu):.3f} ratio_range={min(ratios):.3f}-{max(ratios):.3f} "
        f"cpu_ratio_range={min(cpu):.3f}-{max(cpu):.3f} rounds={len(measured)}"
    )
    if len(measured[0]) > 4:  # a second baseline
        batched = statistics.median(m[0] / m[4] for m in measured)
        batched_cpu = statistics.median(m[2] / m[5] for m in measured)
        line += f" ratio_vs_batched={batched:.3f} cpu_ratio_vs_batched={batched_cpu:.3f}"
    return f"{line} load={load}"


# --------------------------------------------------------------------------- table case

TABLE_CONTRACT = ROOT / "data_contracts" / "churn.yaml"


def churn_columns(n: int, seed: int = 0) -> dict[str, list]:
    """``n`` churn-like rows, column by column (None: missing), deterministic."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cities = np.arange(1, 401)
    weights = 1.0 / cities**1.1
    city = rng.choice(cities, n, p=weights / weights.sum())

    def maybe(values: list, share: float) -> list:
        gone = rng.random(n) < share
        return [None if g else v for v, g in zip(values, gone, strict=True)]

    return {
        "customer_id": [f"2026-11-01-{i:05d}" for i in range(n)],
        "tenure_months": rng.integers(0, 73, n).tolist(),
        "monthly_charges": maybe(rng.uniform(15, 130, n).round(2).tolist(), 0.04),
        "total_spend": maybe(rng.uniform(0, 9000, n).round(2).tolist(), 0.03),
        "support_calls": rng.integers(0, 16, n).tolist(),
        "plan": rng.choice(["basic", "standard", "premium"], n).tolist(),
        "contract_type": maybe(rng.choice(["monthly", "yearly", "two_year"], n).tolist(), 0.05),
        "payment_method": rng.choice(["card", "bank", "paypal", "voucher"], n).tolist(),
        "channel": rng.choice(["store", "web", "app", "phone"], n).tolist(),
        "city": maybe([f"city_{c:03d}" for c in city], 0.03),
        "region_code": rng.choice([11, 12, 21, 22, 31], n).tolist(),
        "churned": rng.integers(0, 2, n).tolist(),
    }


def make_table_snapshot(snap: Path, cols: dict[str, list], shards: int) -> Path:
    """A table snapshot of ``cols`` in ``shards`` Parquet files (the staging layout)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainyard.staging.sources import arrow_type

    contract = read_contract_file()
    schema = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in contract.columns])
    table = pa.table(cols, schema=schema)
    snap.mkdir(parents=True)
    per = -(-table.num_rows // shards)
    names = []
    for s in range(shards):
        name = f"part-{s:05d}.parquet"
        pq.write_table(table.slice(s * per, per), snap / name, row_group_size=65536)
        names.append((name, "data"))
    _manifest(snap, "table", names)
    return snap


def read_contract_file():  # type: ignore[no-untyped-def]
    """The churn contract (the table case's columns and features)."""
    return read_contract(TABLE_CONTRACT)


def write_table_tfrecords(
    cols: dict[str, list], features: dict, out: Path, shards: int
) -> list[str]:
    """The same rows as TFRecord files of tf.train.Example (NaN, ``""`` where missing)."""
    n = len(cols["customer_id"])
    per = -(-n // shards)
    paths = []
    for s in range(shards):
        path = out / f"shard-{s:05d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(s * per, min((s + 1) * per, n)):
                feature = {}
                for name, (dtype, _) in features.items():
                    v = cols[name][i]
                    if dtype == "string":
                        value = tf.train.BytesList(value=[(v or "").encode()])
                        feature[name] = tf.train.Feature(bytes_list=value)
                    elif dtype == "int64":
                        feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
                    else:
                        x = float("nan") if v is None else float(v)
                        feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[x]))
                label = tf.train.Int64List(value=[cols["churned"][i]])
                feature["churned"] = tf.train.Feature(int64_list=label)
                ex = tf.train.Example(features=tf.train.Features(feature=feature))
                w.write(ex.SerializeToString())
        paths.append(str(path))
    return paths


def preprocessing(features: dict, transform: dict):  # type: ignore[no-untyped-def]
    """The model's preprocessing alone: raw inputs to its encoded float32 input."""
    import tf_keras as keras

    from trainyard.training.worker.transform import encode_features

    inputs, encoded = encode_features(features, transform)
    return keras.Model(inputs, encoded)


def table_baseline(paths: list[str], features: dict, prep, batch: int) -> tf.data.Dataset:  # type: ignore[no-untyped-def]
    types = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
    spec = {n: tf.io.FixedLenFeature([], types[d]) for n, (d, _) in features.items()}
    spec["churned"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(record: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        ex = tf.io.parse_single_example(record, spec)
        label = ex.pop("churned")
        one = {n: tf.expand_dims(v, 0) for n, v in ex.items()}
        return {"encoded": tf.squeeze(prep(one), 0)}, label

    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE
    )


def table_batched(paths: list[str], features: dict, prep, batch: int) -> tf.data.Dataset:  # type: ignore[no-untyped-def]
    """The tuned TFRecord pipeline: batch the records, parse and preprocess per batch."""
    types = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
    spec = {n: tf.io.FixedLenFeature([], types[d]) for n, (d, _) in features.items()}
    spec["churned"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(records: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        ex = tf.io.parse_example(records, spec)
        label = ex.pop("churned")
        return {"encoded": prep(ex)}, label

    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.batch(batch, drop_remainder=True)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def table_case(a: argparse.Namespace, tmp: Path) -> str:
    from trainyard.contracts import feature_spec

    contract = read_contract_file()
    features = feature_spec(contract)
    cols = churn_columns(a.examples)
    snap = make_table_snapshot(tmp / "snap", cols, a.shards)
    records = write_table_tfrecords(cols, features, tmp, a.shards)
    ours_in = SnapshotInput(snap, contract, "all")
    prep = preprocessing(features, ours_in.spec.transform)

    def ours() -> tf.data.Dataset:
        ds = ours_in.dataset(a.batch, shuffle=False, repeat=False)
        return ds.map(
            lambda x, y: ({"encoded": prep(x)}, y), num_parallel_calls=tf.data.AUTOTUNE
        ).prefetch(tf.data.AUTOTUNE)

    measured = rounds(
        ours,
        lambda: table_baseline(records, features, prep, a.batch),
        a.repeats,
        lambda: table_batched(records, features, prep, a.batch),
    )
    print(f"examples={a.examples} shards={a.shards} batch={a.batch} features={len(features)}")
    return report("input_pipeline_table", measured)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=["images", "table"], default="images")
    p.add_argument("--examples", type=int, default=None, help="images 30000, table 100000")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a fifth of the examples, 2 repeats")
    a = p.parse_args()
    if a.examples is None:
        a.examples = 100_000 if a.case == "table" else 30_000
    if a.quick:
        a.examples, a.repeats = a.examples // 5, 2
    with tempfile.TemporaryDirectory() as tmp:
        if a.case == "table":
            line = table_case(a, Path(tmp))
        else:
            images, labels = digits_arrays(a.examples)
            snap = make_files_snapshot(
                Path(tmp) / "snap", images=images, labels=labels, shards=a.shards
            )
            records = write_tfrecords(snap, Path(tmp))
            ours_in = SnapshotInput(snap, read_contract(DIGITS_CONTRACT), "all")
            measured = rounds(
                lambda: ours_in.dataset(a.batch, shuffle=False, repeat=False),
                lambda: baseline_dataset(records, a.batch),
                a.repeats,
            )
            print(f"examples={a.examples} shards={a.shards} batch={a.batch}")
            line = report("input_pipeline", measured)
    print(line)


if __name__ == "__main__":
    main()
