"""Real tables: typed features, null markers, statistics of the training split only, the
preprocessing inside the exported model, raw values at serving and stream scoring, and
categorical profiles in validation. Tiny data, real TensorFlow, real files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainyard.config import PipelineConfig
from trainyard.contracts import feature_spec, holdout_mask, load_contract, parse_contract_text
from trainyard.errors import StagingError

ROOT = Path(__file__).resolve().parents[2]
NEGATIVE = ROOT / "tests" / "fixtures" / "contracts" / "negative"

TABLE = """\
dataset: {dataset}
version: 1.0.0
owner: tests@example.com
source: {{format: {fmt}, null_values: ["", "NA", "null"]}}
columns:
  - {{name: id, type: string, nullable: false}}
  - {{name: s, type: string, nullable: true}}
  - {{name: i, type: int64, nullable: true}}
  - {{name: f, type: float64, nullable: true}}
  - {{name: b, type: bool, nullable: true}}
  - {{name: y, type: int64, nullable: false, allowed_values: [0, 1]}}
roles:
  key: id
  label: y
  features:
    - {{name: s, top_k: 5, oov_buckets: 2}}
    - {{name: i, impute: zero}}
    - {{name: f, impute: median, missing_indicator: true}}
    - {{name: b, impute: 0}}
split: {{holdout_fraction: 0.3, by: id}}
"""


def test_the_contract_types_every_feature() -> None:
    churn = load_contract("churn")
    kinds = {n: (f.kind, f.dtype, f.nullable) for n, f in churn.features.items()}
    assert kinds["city"] == ("categorical", "string", True)
    assert kinds["plan"] == ("categorical", "string", False)
    assert kinds["region_code"] == ("categorical", "int64", False)
    assert kinds["monthly_charges"] == ("numeric", "float32", True)
    city, charges, calls = (
        churn.feature("city"),
        churn.feature("monthly_charges"),
        churn.feature("support_calls"),
    )
    assert (city.vocabulary, city.top_k, city.min_frequency, city.oov_buckets) == (None, 50, 5, 4)
    assert churn.feature("plan").vocabulary == ("basic", "standard", "premium")
    assert (charges.impute, charges.missing_indicator, charges.normalize) == (
        "median",
        True,
        "standard",
    )
    assert calls.bucketize == (1.0, 3.0, 6.0)
    assert churn.source.null_values == ("", "NA", "null")
    assert feature_spec(churn)["city"] == ("string", (None,))
    assert feature_spec(churn)["region_code"] == ("int64", (None,))
    assert feature_spec(churn)["tenure_months"] == ("float32", (None,))
    assert load_contract("transactions").source.null_values == ("",)  # the default


NEW_FIELDS = [
    "null_values",
    "kind",
    "impute",
    "missing_indicator",
    "normalize",
    "bucketize",
    "top_k",
    "min_frequency",
    "oov_buckets",
    "max_null_share",
    "max_unseen_share",
    "chi2",
    "null marker",
    "vocabulary",
    "may be null",
    "listed twice",
    "timestamp",
]


@pytest.mark.parametrize("field", NEW_FIELDS)
def test_every_new_field_has_a_negative_fixture(field: str) -> None:
    """``contracts check`` refuses what cannot be trained: each new field has a fixture
    whose ``# expect:`` line is asserted by test_contracts' negative-fixture test."""
    expects = [p.read_text().splitlines()[0] for p in NEGATIVE.glob("*.yaml")]
    assert any(field in line for line in expects), field


# --------------------------------------------------------------------------- staging


def _pipeline(dataset: str, url: Path, fmt: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": dataset,
            "dataset": dataset,
            "start_date": "2026-11-01",
            "source": {"url": str(url), "format": fmt},
            "training": {"model": "mlp"},
            "serving": {"model_name": dataset},
        }
    )


CSV = """\
id,s,i,f,b,y
r0,,,,,0
r1,NA,NA,NA,NA,1
r2,null,null,null,null,0
r3,"",7,2.5,true,1
r4,x,8,3.5,false,0
"""


@pytest.fixture
def table_contracts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "contracts"
    folder.mkdir()
    for fmt in ("csv", "jsonl", "parquet"):
        (folder / f"t_{fmt}.yaml").write_text(TABLE.format(dataset=f"t_{fmt}", fmt=fmt))
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(folder))
    return folder


def test_null_markers_are_read_alike_in_every_column_type_and_format(
    volume_root: Path, table_contracts: Path, tmp_path: Path
) -> None:
    """An empty cell (quoted or not), ``NA`` and ``null`` are null in a string, an
    integer, a float and a bool column alike; JSON Lines and Parquet strings equal to a
    marker too. (CSV's empty cells used to be null in numbers but ``''`` in strings.)"""
    from trainyard import volumes
    from trainyard.staging import stage

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "t.csv").write_text(CSV)
    csv = pq.read_table(
        volumes.table_files(stage(_pipeline("t_csv", raw / "t.csv", "csv"), quiet=True).path)
    )
    rows = csv.to_pylist()
    for r in rows[:4]:
        assert r["s"] is None, r
    for r in rows[:3]:
        assert (r["i"], r["f"], r["b"]) == (None, None, None), r
    assert rows[4] == {"id": "r4", "s": "x", "i": 8, "f": 3.5, "b": False, "y": 0}
    # JSON Lines: typed nulls, and marker strings in a string column
    records = [
        {"id": "r0", "s": "", "i": None, "f": None, "b": None, "y": 0},
        {"id": "r1", "s": "NA", "i": None, "f": None, "b": None, "y": 1},
        {"id": "r2", "s": "null", "i": None, "f": None, "b": None, "y": 0},
        {"id": "r3", "s": "", "i": 7, "f": 2.5, "b": True, "y": 1},
        {"id": "r4", "s": "x", "i": 8, "f": 3.5, "b": False, "y": 0},
    ]
    (raw / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    jsonl = stage(_pipeline("t_jsonl", raw / "t.jsonl", "jsonl"), quiet=True)
    assert pq.read_table(volumes.table_files(jsonl.path)).equals(csv)
    pq.write_table(pa.Table.from_pylist(records, schema=csv.schema), raw / "t.parquet")
    parquet = stage(_pipeline("t_parquet", raw / "t.parquet", "parquet"), quiet=True)
    assert pq.read_table(volumes.table_files(parquet.path)).equals(csv)
    # a marker the contract does not declare is a value: a number column refuses it
    (raw / "bad.csv").write_text("id,s,i,f,b,y\nr0,a,N/A,1,true,0\n")
    with pytest.raises(StagingError, match=r"bad.csv: row 2 column 'i'"):
        stage(_pipeline("t_csv", raw / "bad.csv", "csv"), quiet=True)


# --------------------------------------------------------------------------- statistics


FEATURES = {
    "s": "top_k: 5, oov_buckets: 2",
    "i": "impute: zero",
    "f": "impute: median, missing_indicator: true",
    "b": "impute: 0",
}


def _contract(**features: str) -> object:
    """TABLE's contract, some features' specs replaced (``f="impute: mean"``)."""
    text = TABLE.format(dataset="t", fmt="csv")
    for name, spec in features.items():
        text = text.replace(f"{{name: {name}, {FEATURES[name]}}}", f"{{name: {name}, {spec}}}")
    return parse_contract_text(text, Path("t.yaml"))


STATS_CASES = [
    (
        "top_k by count, ties by value",
        "top_k: 2",
        ["b", "a", "c", "c", "a", "b", "d"],
        {"vocabulary": ["a", "b"], "missing": 0, "distinct": 4},
    ),
    (
        "min_frequency drops the rare",
        "top_k: 9, min_frequency: 2",
        ["a", "a", "b", "", "c", "c"],
        {"vocabulary": ["a", "c"], "missing": 1, "missing_entry": True},
    ),
    ("missing is no token", "top_k: 9", ["", "", "z"], {"vocabulary": ["z"], "count": 1}),
]


@pytest.mark.parametrize(
    ("case", "spec", "values", "want"), STATS_CASES, ids=[c[0] for c in STATS_CASES]
)
def test_learned_vocabulary(case: str, spec: str, values: list[str], want: dict) -> None:
    from trainyard.training.worker.transform import compute_statistics

    contract = _contract(s=spec)
    feats = {
        "s": np.asarray(values, dtype=object),
        "i": np.zeros(len(values), np.float32),
        "f": np.ones(len(values), np.float32),
        "b": np.ones(len(values), np.float32),
    }
    stats = compute_statistics(contract, feats)["features"]["s"]
    assert {k: stats[k] for k in want} == want


@pytest.mark.parametrize(
    ("impute", "fill"), [("mean", 3.0), ("median", 2.0), ("zero", 0.0), ("-1.5", -1.5)]
)
def test_imputation_fill_of_the_training_values(impute: str, fill: float) -> None:
    from trainyard.training.worker.transform import compute_statistics

    contract = _contract(f=f"impute: {impute}")
    values = np.asarray([1.0, np.nan, 2.0, 6.0, np.nan], np.float32)
    feats = {"s": np.asarray(["a"] * 5, object), "i": values, "f": values, "b": values}
    stats = compute_statistics(contract, feats)["features"]["f"]
    assert (stats["fill"], stats["missing"], stats["count"]) == (fill, 2, 3)
    assert (stats["min"], stats["max"], stats["median"]) == (1.0, 6.0, 2.0)


def _table_snapshot(root: Path, rows: int = 400) -> tuple[Path, object, list[str]]:
    """A table snapshot whose holdout rows hold a category, and a number, of their own."""
    from tests.support.trainer import _manifest

    contract = parse_contract_text(TABLE.format(dataset="t", fmt="csv"), Path("t.yaml"))
    keys = [f"k{i:04d}" for i in range(rows)]
    held = holdout_mask(keys, 0.3)
    cols = {
        "id": keys,
        "s": ["only-in-holdout" if h else ["a", "b", None][i % 3] for i, h in enumerate(held)],
        "i": [None if i % 7 == 0 else i % 5 for i in range(rows)],
        "f": [1000.0 if h else (None if i % 4 == 0 else float(i % 10)) for i, h in enumerate(held)],
        "b": [bool(i % 2) for i in range(rows)],
        "y": [i % 2 for i in range(rows)],
    }
    snap = root / "snap"
    snap.mkdir(parents=True)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("s", pa.string()),
            ("i", pa.int64()),
            ("f", pa.float64()),
            ("b", pa.bool_()),
            ("y", pa.int64()),
        ]
    )
    pq.write_table(pa.table(cols, schema=schema), snap / "part-00000.parquet")
    _manifest(snap, "table", [("part-00000.parquet", "data")])
    return snap, contract, keys


def test_statistics_come_from_the_training_split_only(tmp_path: Path) -> None:
    from trainyard.training.worker.input import SnapshotInput

    snap, contract, keys = _table_snapshot(tmp_path)
    transform = SnapshotInput(snap, contract, "train").spec.transform
    assert transform is not None and transform["split"] == "train"
    s, f = transform["features"]["s"], transform["features"]["f"]
    assert s["vocabulary"] == ["a", "b"] and s["missing_entry"] is True
    assert "only-in-holdout" not in json.dumps(transform)
    assert f["max"] == 9.0  # the holdout's 1000.0 never counted
    train = [float(i % 10) for i, h in enumerate(holdout_mask(keys, 0.3)) if not h and i % 4]
    assert f["mean"] == pytest.approx(np.mean(train)) and f["fill"] == float(np.median(train))


# --------------------------------------------------------------------------- the model


def _preprocessing_model(transform: dict) -> object:
    import tf_keras as keras

    from trainyard.training.worker.transform import encode_features

    inputs = {n: ("string" if n == "s" else "float32", (None,)) for n in ("s", "i", "f", "b")}
    tensors, encoded = encode_features(inputs, transform)
    return keras.Model(tensors, encoded)


def test_the_preprocessing_layers_read_raw_values() -> None:
    import tensorflow as tf

    from trainyard.training.worker.transform import compute_statistics

    contract = _contract()
    feats = {
        "s": np.asarray(["a", "b", "a", ""], object),
        "i": np.asarray([1, 2, 3, np.nan], np.float32),
        "f": np.asarray([1, 2, 3, np.nan], np.float32),
        "b": np.asarray([0, 1, 1, 1], np.float32),
    }
    transform = compute_statistics(contract, feats)
    model = _preprocessing_model(transform)
    out = model(
        {
            "s": tf.constant(["a", "NA", "never-seen", "null"]),
            "i": tf.constant([np.nan, 2, 2, 2], tf.float32),
            "f": tf.constant([np.nan, 2, 2, 1], tf.float32),
            "b": tf.constant([1, 1, 0, 0], tf.float32),
        }
    ).numpy()
    # s: 2 OOV buckets, then "" (missing), "a", "b"; then i, f, f's indicator, b
    oov, missing, a = out[:, 0:2], out[:, 2], out[:, 3]
    assert a.tolist() == [1, 0, 0, 0] and missing.tolist() == [0, 1, 0, 1]
    assert oov.sum(axis=1).tolist() == [0, 0, 1, 0]
    i, f, indicator = out[:, 5], out[:, 6], out[:, 7]
    i_stats, f_stats = transform["features"]["i"], transform["features"]["f"]
    assert i[0] == pytest.approx((0.0 - i_stats["mean"]) / math.sqrt(i_stats["variance"]))
    assert f[0] == pytest.approx((2.0 - f_stats["mean"]) / math.sqrt(f_stats["variance"]))
    assert indicator.tolist() == [1, 0, 0, 0]


FRESH = """
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry
from tensorflow.core.protobuf import saved_model_pb2
assert not any(m.startswith("trainyard") for m in sys.modules)
path = sys.argv[1]
sm = saved_model_pb2.SavedModel()
sm.ParseFromString(open(path + "/saved_model.pb", "rb").read())
graph = sm.meta_graphs[0].graph_def
ops = {n.op for n in graph.node}
for fn in graph.library.function:
    ops |= {n.op for n in fn.node_def}
unknown = sorted(op for op in ops if op_def_registry.get(op) is None)
fn = tf.saved_model.load(path).signatures["serving_default"]
out = fn(s=tf.constant(["a", "NA", "zz", ""]), i=tf.constant([1, np.nan, 3, 4], tf.float32),
         f=tf.constant([np.nan, 2, 3, 4], tf.float32), b=tf.constant([1, 0, 1, 0], tf.float32))
one = fn(s=tf.constant(["NA"]), i=tf.constant([np.nan]), f=tf.constant([2.0]),
         b=tf.constant([0.0]))  # a batch of one row keeps its batch dimension
print(json.dumps({"unknown": unknown, "ops": len(ops), "one": one["probabilities"].shape.as_list(),
                  "p": out["probabilities"].numpy().view(np.uint32).tolist()}))
"""


def test_the_export_takes_raw_values_and_needs_only_stock_tensorflow(tmp_path: Path) -> None:
    """TF Serving lags TensorFlow and knows no custom op: the exported model is loaded and
    run in a fresh process that imports TensorFlow alone, and every op of its graph is a
    registered stock op."""
    import tensorflow as tf

    from trainyard.training.worker.architectures import ModelSpec, build_model
    from trainyard.training.worker.input import SnapshotInput
    from trainyard.training.worker.main import _export

    snap, contract, _ = _table_snapshot(tmp_path)
    inp = SnapshotInput(snap, contract, "train")
    inputs = feature_spec(contract)
    model = build_model("mlp", ModelSpec(inputs, 2, seed=1, transform=inp.spec.transform))
    _export(model, inputs, tmp_path / "model", ["no", "yes"])
    here = model(
        {
            "s": tf.constant(["a", "NA", "zz", ""]),
            "i": tf.constant([1, np.nan, 3, 4], tf.float32),
            "f": tf.constant([np.nan, 2, 3, 4], tf.float32),
            "b": tf.constant([1, 0, 1, 0], tf.float32),
        },
        training=False,
    )
    here_p = tf.nn.softmax(here, axis=-1).numpy()
    # a NaN where the contract allows no missing value is refused, naming the feature (it
    # went through ReLU as 0: the same scores for every such row)
    import tf_keras as keras

    from trainyard.training.worker.transform import encode_features

    stats = {"kind": "numeric", "fill": None, "normalize": "none"}
    ins, out = encode_features({"amount": ("float32", (None,))}, {"features": {"amount": stats}})
    strict = keras.Model(ins, out)
    assert strict(tf.constant([1.5, 2.0])).numpy().ravel().tolist() == [1.5, 2.0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="amount: a missing value"):
        strict(tf.constant([1.5, np.nan]))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, str(tmp_path / "model")],
        cwd="/",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["unknown"] == [] and got["ops"] > 10
    assert got["one"] == [1, 2]
    served = np.asarray(got["p"], np.uint32).view(np.float32)
    assert np.isfinite(served).all()
    np.testing.assert_allclose(served, here_p, rtol=1e-6)


# --------------------------------------------------------------------------- serving


def test_requests_take_strings_and_nulls_and_name_a_wrong_type() -> None:
    from trainyard.serving.schema import InvalidRequest, decode_predict_request

    spec = {"x": ("float32", (None,)), "c": ("string", (None,))}
    rows, n, columnar = decode_predict_request(
        b'{"instances": [{"x": null, "c": null}, {"x": 1.5, "c": "a"}, {"x": NaN, "c": "NA"}]}',
        spec,
    )
    assert n == 3 and not columnar
    assert np.isnan(rows["x"][[0, 2]]).all() and rows["x"][1] == 1.5
    assert rows["c"].tolist() == [b"", b"a", b"NA"]
    cols, _, columnar = decode_predict_request(
        b'{"inputs": {"x": [null, 2], "c": ["b", null]}}', spec
    )
    assert columnar and np.isnan(cols["x"][0]) and cols["c"].tolist() == [b"b", b""]
    with pytest.raises(
        InvalidRequest, match=r"instances\.x: expected float32 numbers, got strings"
    ):
        decode_predict_request(b'{"instances": [{"x": "2", "c": "a"}]}', spec)
    with pytest.raises(InvalidRequest, match=r"inputs.c: expected strings .* got int"):
        decode_predict_request(b'{"inputs": {"x": [1], "c": [3]}}', spec)


# --------------------------------------------------------------------------- streams


def test_stream_records_take_raw_values_with_nulls_and_markers() -> None:
    from trainyard.streaming.model_endpoint import predict_body
    from trainyard.streaming.records import RecordChecker

    checker = RecordChecker(load_contract("churn"))
    base = {
        "customer_id": "2026-11-05-00001",
        "tenure_months": 3,
        "monthly_charges": 20.5,
        "total_spend": 60.0,
        "support_calls": 1,
        "plan": "basic",
        "contract_type": "yearly",
        "payment_method": "card",
        "channel": "app",
        "city": "city_001",
        "region_code": 11,
    }
    records = [
        base,
        {
            **base,
            "monthly_charges": None,
            "total_spend": "NA",
            "contract_type": "null",
            "city": "",
        },
        {k: v for k, v in base.items() if k not in ("monthly_charges", "city")},  # absent
        {**base, "plan": "NA"},
        {**base, "tenure_months": None},
        {**base, "channel": 3},
    ]
    reasons, inputs = checker.check_parsed(records)
    assert reasons[:3] == [None, None, None]
    assert reasons[3] == "plan: null ('NA')"
    assert reasons[4] == "tenure_months: null"
    assert reasons[5] is not None and reasons[5].startswith("channel: expected a string")
    assert inputs["city"].tolist() == ["city_001", "", ""]
    assert inputs["contract_type"].tolist() == ["yearly", "", "yearly"]
    assert np.isnan(inputs["monthly_charges"][1:]).all() and np.isnan(inputs["total_spend"][1])
    assert inputs["region_code"].dtype == np.int64
    body = json.loads(predict_body(inputs).replace(b"NaN", b'"NaN"'))
    assert body["inputs"]["monthly_charges"][1] == "NaN"  # the token TF Serving reads
    assert body["inputs"]["city"] == ["city_001", "", ""]


# --------------------------------------------------------------------------- validation


def _categorical_snapshot(folder: Path, cats: list[str | None], y: list[int]) -> list[Path]:
    folder.mkdir(parents=True)
    n = len(cats)
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(n)],
            "s": cats,
            "i": [1] * n,
            "f": [None if i % 10 == 0 else 1.0 for i in range(n)],
            "b": [True] * n,
            "y": y,
        }
    )
    pq.write_table(table, folder / "part-00000.parquet")
    return [folder / "part-00000.parquet"]


def test_validation_profiles_categories_nulls_and_unseen_values(tmp_path: Path) -> None:
    from scipy.stats import chi2_contingency

    from trainyard.validation.runner import run_contract

    text = (
        TABLE.format(dataset="t", fmt="csv")
        .replace(
            "  - {name: s, type: string, nullable: true}",
            "  - {name: s, type: string, nullable: true, max_null_share: 0.05, "
            "max_unseen_share: 0.1}",
        )
        .replace(
            "  - {name: f, type: float64, nullable: true}",
            "  - {name: f, type: float64, nullable: true, max_null_share: 0.2}",
        )
        + "drift:\n  - {column: s, method: chi2, max: 0.05}\n  - {column: s, method: psi, max: 5}\n"
    )
    contract = parse_contract_text(text, Path("t.yaml"))
    old = ["a"] * 60 + ["b"] * 40
    new = ["a"] * 30 + ["b"] * 40 + ["c"] * 20 + [None] * 10
    y = [i % 2 for i in range(100)]
    previous = _categorical_snapshot(tmp_path / "old", old, y)
    files = _categorical_snapshot(tmp_path / "new", new, y)
    run = run_contract(contract, files, previous_files=previous, previous_id="old")
    by_rule = {(o.rule, o.column): o for o in run.outcomes}
    nulls = by_rule[("max_null_share", "s")]
    assert not nulls.success and nulls.observed == pytest.approx(0.1)
    assert "10.00% of the rows are null" in nulls.reason
    assert by_rule[("max_null_share", "f")].success
    unseen = by_rule[("max_unseen_share", "s")]
    assert not unseen.success and unseen.observed == pytest.approx(20 / 90)
    assert unseen.samples == ["c"]
    chi2 = by_rule[("drift:chi2", "s")]
    stat = chi2_contingency(np.array([[30, 40, 20], [60, 40, 0]]), correction=False)
    assert chi2.details["chi2"] == pytest.approx(stat.statistic)
    assert chi2.details["p_value"] == pytest.approx(stat.pvalue)
    assert chi2.observed == pytest.approx(math.sqrt(stat.statistic / 190))
    assert not chi2.success
    shares = {v: (now, before) for v, now, before in chi2.details["categories"]}
    assert shares["c"] == (pytest.approx(20 / 90), 0.0) and shares["a"][1] == 0.6
    profile = run.profile["s"]
    assert (profile["nulls"], profile["distinct"], profile["unseen"]) == (10, 3, 20)
    assert profile["categories"][0][:2] == ["b", 40]
    # the first snapshot has no baseline: no unseen share is measured
    first = run_contract(contract, previous)
    assert ("max_unseen_share", "s") not in {(o.rule, o.column) for o in first.outcomes}
    assert "unseen_share" not in first.profile["s"]


def test_a_training_split_with_every_value_missing_is_refused_naming_the_feature() -> None:
    from trainyard.errors import TrainingError
    from trainyard.training.worker.transform import compute_statistics

    contract = _contract()
    feats = {
        "s": np.asarray(["a"], object),
        "i": np.asarray([np.nan], np.float32),
        "f": np.asarray([1.0], np.float32),
        "b": np.asarray([1.0], np.float32),
    }
    with pytest.raises(TrainingError, match="feature 'i': every value of the training split"):
        compute_statistics(contract, feats)


def test_the_churn_generator_is_deterministic_with_nulls_and_a_drifting_channel(
    tmp_path: Path,
) -> None:
    import csv
    import datetime as dt

    from trainyard.staging.bootstrap import churn_channel_weights, synthetic_churn

    a = synthetic_churn(tmp_path / "a" / "x.csv", "2026-11-02").read_bytes()
    b = synthetic_churn(tmp_path / "b" / "x.csv", "2026-11-02").read_bytes()
    assert a == b
    rows = list(csv.DictReader(a.decode().splitlines()))
    assert 0.01 < sum(r["monthly_charges"] == "" for r in rows) / len(rows) < 0.1
    assert any(r["total_spend"] in ("NA", "null") for r in rows)
    assert len({r["city"] for r in rows}) > 100  # the long tail
    assert churn_channel_weights(dt.date(2026, 11, 3))[2] == pytest.approx(0.10)
    assert churn_channel_weights(dt.date(2026, 11, 5))[2] == pytest.approx(0.40)


def test_the_run_page_draws_category_shares_and_the_column_profile(tmp_path: Path) -> None:
    """The drift chart of a categorical column shows each category's share now and before;
    the columns table shows null shares, categories and the share never seen before."""
    from trainyard import runview
    from trainyard.validation.runner import run_contract

    text = (
        TABLE.format(dataset="t", fmt="csv") + "drift:\n  - {column: s, method: chi2, max: 0.05}\n"
    )
    contract = parse_contract_text(text, Path("t.yaml"))
    y = [i % 2 for i in range(100)]
    previous = _categorical_snapshot(tmp_path / "old", ["a"] * 60 + ["b"] * 40, y)
    files = _categorical_snapshot(tmp_path / "new", ["a"] * 30 + ["b"] * 50 + ["<c>"] * 20, y)
    run = run_contract(contract, files, previous_files=previous, previous_id="0ld")
    val = {
        "success": True,
        "rows": run.rows,
        "rules": [o.to_dict() for o in run.outcomes],
        "previous_snapshot_id": "0ld",
        "profile": run.profile,
    }
    story = {"pipeline": "t", "run_id": "r", "snapshot": {"id": "s", "validation": val}}
    page = runview.render_run(story, None, "/pipe")
    assert "drift per column vs snapshot 0ld" in page
    assert "s: share of each category" in page and 'class="chart shares"' in page
    assert "&lt;c&gt; now: 20.0%" in page and "a before: 60.0%" in page
    assert 'class="profile"' in page and "<td>f</td><td>10.0%</td>" in page
    assert "&lt;c&gt; 20%" in page  # most frequent categories, escaped
