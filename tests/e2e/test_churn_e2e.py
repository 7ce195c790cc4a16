"""The shipped categorical pipeline, end to end: raw strings and nulls in, one model.

``churn`` (``dags/pipelines/churn.yaml``, ``data_contracts/churn.yaml``) is backfilled over
5 days from the CLI as a new user would: every day staged from a CSV with empty cells and
``NA``/``null`` markers, validated, the last day trained on the whole window, gated,
deployed to the local model server. Then, over real HTTP:

* ``:predict`` takes raw rows, strings and nulls, in the row and the columnar format, and
  answers what evaluation computes offline for the same rows;
* a city never seen in training is accepted and scored through an out-of-vocabulary
  bucket;
* the skew check: the served model and the evaluation step give bit-identical outputs on
  the whole holdout, and the vocabularies recorded with the version are the ones inside
  the SavedModel, read back in a process that imports TensorFlow alone.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.harness import Project, make_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04", "2026-11-05"]


@dataclass
class Backfilled:
    proj: Project
    out: subprocess.CompletedProcess[str]
    version_dir: Path
    meta: dict[str, Any]


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    tmp = tmp_path_factory.mktemp("churn")
    raw = tmp / "raw" / "{ds}.csv"  # the bootstrap writes each day there, as in the project
    overrides = {"from": "churn", "source": {"url": str(raw)},
                 "training": {"epochs": 4, "workers": 1}}  # fmt: skip
    proj = make_project(tmp, extra_pipelines={"churn": overrides})
    try:
        out = proj.trainyard(
            "run", "--pipeline", "churn", "--ds", DAYS[0], "--end-ds", DAYS[-1], timeout=1100
        )
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        version_dir = proj.volume_root / "_models" / "churn" / "versions" / "1"
        meta = json.loads((version_dir / "metadata.json").read_text())
        yield Backfilled(proj, out, version_dir, meta)
    finally:
        proj.stop_server()


def _client(b: Backfilled) -> Any:
    from trainyard.serving.client import ServingClient

    return ServingClient("127.0.0.1", b.proj.port, timeout=60)


def _raw_holdout(b: Backfilled) -> tuple[list[str], dict[str, list[Any]]]:
    """The holdout rows of the version's window as the snapshot holds them (None: null)."""
    import pyarrow.parquet as pq

    from trainyard.contracts import parse_contract
    from trainyard.training.worker.data import select
    from trainyard.volumes import data_shards

    contract = parse_contract(Path(__file__).resolve().parents[2] / "data_contracts/churn.yaml")
    keys: list[str] = []
    raw: dict[str, list[Any]] = {f: [] for f in contract.roles.features}
    for snap in b.meta["snapshots"]:
        folder = b.proj.volume_root / "churn" / "snapshots" / snap["snapshot_id"]
        for shard in data_shards(folder, "table"):
            table = pq.read_table(shard).to_pydict()
            mask = select(table["customer_id"], contract.split.holdout_fraction, "holdout")
            keys += [k for k, m in zip(table["customer_id"], mask, strict=True) if m]
            for f in raw:
                raw[f] += [v for v, m in zip(table[f], mask, strict=True) if m]
    return keys, raw


def _offline(b: Backfilled) -> tuple[list[str], dict[str, np.ndarray]]:
    """What the evaluation step computes on the holdout (its own functions, in-process)."""
    from trainyard.contracts import parse_contract
    from trainyard.evaluation.metrics import run_model
    from trainyard.training.worker.data import load_window_examples

    contract = parse_contract(Path(__file__).resolve().parents[2] / "data_contracts/churn.yaml")
    dirs = [
        b.proj.volume_root / "churn" / "snapshots" / s["snapshot_id"] for s in b.meta["snapshots"]
    ]
    examples = load_window_examples(dirs, contract, "holdout")
    return examples.keys, run_model(b.version_dir / "model", examples.features)


def test_backfill_trains_gates_and_serves_a_model_of_raw_values(churn: Backfilled) -> None:
    out = churn.out.stdout
    assert "gate          promote" in out and "served        version 1" in out, out[-2000:]
    assert "8 smoke rows matched offline evaluation" in out
    transform = churn.meta["transform"]  # the statistics, in the version's lineage
    assert transform["split"] == "train" and len(transform["snapshots"]) == len(DAYS)
    city = transform["features"]["city"]
    assert city["vocabulary_source"] == "learned" and len(city["vocabulary"]) == 50
    assert transform["features"]["monthly_charges"]["missing"] > 0
    assert (churn.version_dir / "transform.json").is_file()
    # the app's share jumps from the fourth day: the channel's drift rules say so (warn)
    summaries = sorted((churn.proj.volume_root / "churn" / "snapshots").glob("*/validation/*.json"))
    rules = [r for p in summaries for r in json.loads(p.read_text()).get("rules", [])]
    assert any(r["rule"] == "drift:chi2" and r["column"] == "channel" and not r["success"]
               for r in rules)  # fmt: skip
    with _client(churn) as client:
        meta = client.metadata("churn")
    inputs = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["city"]["dtype"] == "DT_STRING" and inputs["plan"]["dtype"] == "DT_STRING"
    assert inputs["monthly_charges"]["dtype"] == "DT_FLOAT"
    assert inputs["region_code"]["dtype"] == "DT_INT64"


def test_predict_takes_strings_and_nulls_and_answers_as_evaluation(churn: Backfilled) -> None:
    keys, raw = _raw_holdout(churn)
    off_keys, offline = _offline(churn)
    assert keys == off_keys
    n = 64
    nulls = [i for i in range(len(keys)) if raw["monthly_charges"][i] is None]
    rows = sorted(set(range(n)) | set(nulls[:8]))  # some rows with a null number
    assert any(raw["contract_type"][i] is None for i in range(len(keys)))
    columns = {f: [raw[f][i] for i in rows] for f in raw}
    assert None in columns["monthly_charges"]
    instances = [{f: columns[f][j] for f in columns} for j in range(len(rows))]
    want = offline["probabilities"][rows]
    with _client(churn) as client:
        by_row = client.predict("churn", instances=instances)
        by_column = client.predict("churn", inputs=columns)
        one_row = client.predict("churn", instances=instances[:1])  # a batch of one
        one_column = client.predict("churn", inputs={f: v[:1] for f, v in columns.items()})
    np.testing.assert_allclose(one_row[0]["probabilities"], want[0], rtol=1e-6)
    np.testing.assert_allclose(one_column["probabilities"][0], want[0], rtol=1e-6)
    got_rows = np.asarray([p["probabilities"] for p in by_row], dtype=np.float32)
    got_columns = np.asarray(by_column["probabilities"], dtype=np.float32)
    np.testing.assert_array_equal(got_rows, want)
    np.testing.assert_array_equal(got_columns, want)
    assert [p["class_name"] for p in by_row] == [["stays", "churns"][c] for c in
                                                  offline["class_id"][rows]]  # fmt: skip


def test_an_unseen_category_is_scored_through_an_oov_bucket(churn: Backfilled) -> None:
    import tensorflow as tf

    vocabulary = churn.meta["transform"]["features"]["city"]["vocabulary"]
    buckets = churn.meta["transform"]["features"]["city"]["oov_buckets"]
    unseen = [f"Atlantis-{i}" for i in range(40)]
    assert not set(unseen) & set(vocabulary)
    bucket = tf.strings.to_hash_bucket_fast(unseen, buckets).numpy().tolist()
    first_bucket = [c for c, k in zip(unseen, bucket, strict=True) if k == 0]
    a, b = first_bucket[0], first_bucket[-1]
    other = next(c for c, k in zip(unseen, bucket, strict=True) if k != 0)
    row = {"tenure_months": 3, "monthly_charges": None, "total_spend": None,
           "support_calls": 4, "plan": "basic", "contract_type": "NA",
           "payment_method": "voucher", "channel": "app", "region_code": 31}  # fmt: skip
    with _client(churn) as client:
        got = client.predict(
            "churn", instances=[{**row, "city": c} for c in (a, b, other, vocabulary[0])]
        )
    probs = [p["probabilities"][1] for p in got]
    assert all(0.0 < p < 1.0 for p in probs)
    assert a != b and probs[0] == probs[1]  # one bucket, one score
    assert len({probs[0], probs[2], probs[3]}) == 3  # another bucket, a known city: others


def test_served_and_evaluated_outputs_are_bit_identical_on_the_holdout(churn: Backfilled) -> None:
    keys, raw = _raw_holdout(churn)
    _, offline = _offline(churn)
    served: list[np.ndarray] = []
    with _client(churn) as client:
        for start in range(0, len(keys), 1024):  # evaluation's batch size
            chunk = {f: v[start : start + 1024] for f, v in raw.items()}
            out = client.predict("churn", inputs=chunk)
            served.append(np.asarray(out["probabilities"], dtype=np.float32))
    got = np.concatenate(served)
    assert got.shape == offline["probabilities"].shape
    assert np.array_equal(got.view(np.uint32), offline["probabilities"].view(np.uint32))


READ_VOCABULARIES = """
import json, sys
import tensorflow as tf
assert not any("trainyard" in m for m in sys.modules)
loaded = tf.saved_model.load(sys.argv[1])
tables, seen = [], set()
def walk(obj, depth=0):
    if id(obj) in seen or depth > 16:
        return
    seen.add(id(obj))
    if type(obj).__name__.endswith("StaticHashTable"):
        try:  # a wrong key type is an error here, where the export would abort the process
            tf.raw_ops.LookupTableFindV2(table_handle=obj.resource_handle, keys=tf.constant([""]),
                                         default_value=tf.constant(-1, tf.int64))
            keys = tf.string
        except tf.errors.InvalidArgumentError:
            keys = tf.int64
        k, v = tf.raw_ops.LookupTableExportV2(
            table_handle=obj.resource_handle, Tkeys=keys, Tvalues=tf.int64)
        pairs = sorted(zip(v.numpy().tolist(), k.numpy().tolist()))
        tables.append([x.decode() if isinstance(x, bytes) else x for _, x in pairs])
    for child in obj._trackable_children().values():
        walk(child, depth + 1)
walk(loaded)
print(json.dumps(tables))
"""


def test_recorded_vocabularies_are_the_ones_inside_the_saved_model(churn: Backfilled) -> None:
    from trainyard.training.worker.transform import lookup_vocabulary

    clean = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", READ_VOCABULARIES, str(churn.version_dir / "model")],
        capture_output=True, text=True, timeout=300, env=clean, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    inside = json.loads(proc.stdout.strip().splitlines()[-1])
    recorded = [
        lookup_vocabulary(stats)
        for stats in churn.meta["transform"]["features"].values()
        if stats["kind"] == "categorical"
    ]
    assert sorted(map(json.dumps, inside)) == sorted(map(json.dumps, recorded))
    assert not math.isnan(churn.meta["transform"]["features"]["monthly_charges"]["fill"])


def test_stream_scoring_sends_the_same_raw_records_through_the_same_signature(
    churn: Backfilled, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Records with nulls, null markers, absent fields and an unseen city are scored as
    ``:predict`` scores them; a null where the contract allows none is dead-lettered."""
    import orjson

    from trainyard.contracts import load_contract
    from trainyard.streaming import redis_server
    from trainyard.streaming.engines import RedisStreams, Streams
    from trainyard.streaming.model_endpoint import ModelEndpoint
    from trainyard.streaming.records import RecordChecker
    from trainyard.streaming.scorer import Scorer

    keys, raw = _raw_holdout(churn)
    records = [{"customer_id": k, **{f: v[i] for f, v in raw.items()}} for i, k in
               enumerate(keys[:30])]  # fmt: skip
    records[0]["total_spend"] = "NA"  # a marker in a number column: missing
    records[1]["contract_type"] = "null"  # ... in a category
    records[2].pop("city")  # absent: missing
    records[3]["city"] = "a city never seen"
    bad = {**records[4], "customer_id": "2026-11-05-99999", "plan": "NA"}
    folder = tmp_path_factory.mktemp("redis")
    url = redis_server.ensure_running(folder)
    streams = Streams("churn.in", "churn.out", "churn.dead", "churn-group")
    engine = RedisStreams(url, streams, consumer="s")
    try:
        engine.produce([(None, orjson.dumps(r)) for r in [*records, bad]])
        checker = RecordChecker(load_contract("churn"))  # the project's contract
        endpoint = ModelEndpoint("127.0.0.1", churn.proj.port, "churn")
        stats = Scorer(engine, checker, endpoint).run(
            max_records=len(records) + 1, exit_when_idle_s=5
        )
        assert (stats.scored, stats.dead) == (len(records), 1)
        r = engine.r
        scored = {o["id"]: o["score"] for o in (orjson.loads(f[b"value"]) for _, f in
                                                  r.xrange("churn.out"))}  # fmt: skip
        (dead,) = [orjson.loads(f[b"value"]) for _, f in r.xrange("churn.dead")]
        assert dead["id"] == bad["customer_id"] and dead["reason"] == "plan: null ('NA')"
        # :predict takes the same rows; a number's input takes null, not a marker string
        contract = load_contract("churn")
        markers = set(contract.source.null_values)
        numeric = {f for f in raw if contract.feature(f).dtype == "float32"}
        direct = [
            {f: None if f in numeric and rec.get(f) in markers else rec.get(f) for f in raw}
            for rec in records
        ]
        with _client(churn) as client:
            want = [p["probabilities"][1] for p in client.predict("churn", instances=direct)]
        got = [scored[rec["customer_id"]] for rec in records]
        np.testing.assert_allclose(got, want, rtol=1e-6)
    finally:
        engine.close()
        redis_server.stop(folder)
