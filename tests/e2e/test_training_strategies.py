"""End-to-end: real worker processes train on CPU with each strategy and export a model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.trainer import (
    make_files_snapshot,
    publish_fixture,
)
from trainyard.config import TrainingConfig, parse_pipeline
from trainyard.training.launcher import run_training

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    pytest.param(
        "digits_files",
        TrainingConfig(model="small_cnn", strategy="multi_worker_mirrored", workers=2, epochs=2,
                       batch_size=64, learning_rate=0.003, steps_per_execution=4),
        ["worker:0", "worker:1"],
        0.8,
        id="mwms-2-workers-images",
    ),
    pytest.param(  # a table with a learned vocabulary and missing values: lookup tables
        "blobs_categorical",
        TrainingConfig(model="mlp", strategy="parameter_server", workers=2, parameter_servers=1,
                       epochs=2, batch_size=32, learning_rate=0.01, steps_per_execution=4),
        ["ps:0", "chief:0", "worker:0", "worker:1"],
        0.8,
        id="ps-chief-2-workers-1-ps-table",
    ),
]  # fmt: skip

CATEGORICAL_CONTRACT = """\
dataset: blobs
version: 1.0.0
owner: ml@example.com
source: {format: parquet, null_values: ["", "NA"]}
columns:
  - {name: id, type: string}
  - {name: x1, type: float64, nullable: true}
  - {name: x2, type: float64}
  - {name: shape, type: string, nullable: true}
  - {name: label, type: int64}
roles:
  key: id
  label: label
  features: [{name: x1, impute: median, missing_indicator: true}, x2, {name: shape, top_k: 3}]
  num_classes: 3
split:
  holdout_fraction: 0.2
  by: id
"""


def _categorical_snapshot(snap: Path, n: int) -> Path:
    """Blobs with a string feature telling the class most of the time, and missing values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.support.trainer import _manifest, blobs

    cols = blobs(n)
    rng = np.random.default_rng(1)
    names = np.array(["round", "square", "spiky"])
    shape = np.where(rng.random(n) < 0.8, names[cols["label"]], names[rng.integers(0, 3, n)])
    table = pa.table(
        {
            "id": cols["id"],
            "x1": [None if m else v for v, m in zip(cols["x1"], rng.random(n) < 0.1, strict=True)],
            "x2": cols["x2"],
            "shape": [None if m else s for s, m in zip(shape, rng.random(n) < 0.05, strict=True)],
            "label": cols["label"],
        }
    )
    snap.mkdir(parents=True)
    pq.write_table(table, snap / "part-00000.parquet")
    _manifest(snap, "table", [("part-00000.parquet", "data")])
    return snap


def _check_saved_model(model_dir: Path, inputs: dict[str, list[int | None]]) -> dict:
    """Load the SavedModel in a fresh process (as serving would) and describe its signature."""
    code = f"""
import json, os, sys
import numpy as np, tensorflow as tf
m = tf.saved_model.load({str(model_dir)!r})
sig = m.signatures["serving_default"]
_, kw = sig.structured_input_signature
feed = {{n: tf.zeros([3] + [d for d in s.shape[1:]], s.dtype) for n, s in kw.items()}}
out = sig(**feed)
print(json.dumps({{"inputs": {{n: [d for d in s.shape] for n, s in kw.items()}},
  "outputs": {{k: [list(v.shape), v.dtype.name] for k, v in out.items()}}}}))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _event_scalars(log_dir: Path, tag: str) -> list[int]:
    """The steps at which TensorBoard event files in ``log_dir`` hold the scalar ``tag``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    tags = acc.Tags()
    if tag in tags.get("scalars", []):
        return [e.step for e in acc.Scalars(tag)]
    return [e.step for e in acc.Tensors(tag)] if tag in tags.get("tensors", []) else []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(("data", "params", "roles", "min_accuracy"), CASES)
def test_strategy_trains_and_exports(
    data: str, params: TrainingConfig, roles: list[str], min_accuracy: float, volume_root: Path,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    pipeline = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    if data == "digits_files":
        snap = publish_fixture(
            make_files_snapshot(volume_root / "incoming", n=None, shards=4), volume_root, "digits"
        )
        expected_inputs = {"image": [None, 8, 8, 1]}
    else:  # numbers, one with missing values, and a category: lookup tables under PS
        contracts = tmp_path / "contracts"
        contracts.mkdir()
        (contracts / "blobs.yaml").write_text(CATEGORICAL_CONTRACT)
        monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(contracts))
        pipeline = pipeline.model_copy(update={"dataset": "blobs"})
        snap = publish_fixture(
            _categorical_snapshot(volume_root / "incoming", 1200), volume_root, "blobs"
        )
        expected_inputs = {"x1": [None], "x2": [None], "shape": [None]}
    lines: list[str] = []
    monkeypatch.setenv("TRAINYARD_PROGRESS_S", "0")  # a progress line at every step
    result = run_training(pipeline, params, snap, run_id="r1", log=lines.append)

    assert result.attempts == 1
    assert result.tf_config_roles == roles
    for role in roles:  # every task's output reached the log callback, prefixed
        assert any(
            line.startswith(f"[{role}] ") and "TRAINYARD_WORKER_READY" in line for line in lines
        )
    fitting = [r for r in roles if r.startswith("chief") or params.strategy != "parameter_server"]
    for role in fitting:  # epoch, step, rate and ETA per worker; a PS step's loss is remote
        progress = [ln for ln in lines if ln.startswith(f"[{role}] epoch ")]
        assert progress and all("steps/s, ETA " in ln for ln in progress), lines
        assert any(ln.startswith(f"[{role}] epoch 2/2 step ") for ln in progress)
        with_loss = [ln for ln in progress if " loss " in ln]
        assert bool(with_loss) is (params.strategy != "parameter_server")
    assert _event_scalars(result.output_dir / "tensorboard" / "train", "epoch_loss") == [0, 1]
    assert [p.name for p in (result.output_dir / "tensorboard").iterdir()] == ["train"]
    assert result.metrics["epochs"] == 2
    assert result.metrics["accuracy"] >= min_accuracy, result.metrics
    assert result.metrics["examples_per_s"] > 0
    assert result.history["attempts"] == [{"attempt": 1, "start_epoch": 0}]
    assert [e["epoch"] for e in result.history["epochs"]] == [0, 1]
    sig = _check_saved_model(result.output_dir / "model", expected_inputs)
    assert sig["inputs"] == expected_inputs
    assert sig["outputs"]["probabilities"] == [[3, 10 if data == "digits_files" else 3], "float32"]
    assert sig["outputs"]["class_id"] == [[3], "int64"]
    assert not [
        p for p in (result.output_dir).iterdir() if p.name.startswith(".")
    ]  # no temp dirs left
    assert psutil.Process().children(recursive=True) == []
