"""Evaluation: numpy metrics against scikit-learn, and real SavedModels built with tf.Module."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import log_loss, mean_absolute_error, mean_squared_error, roc_auc_score

from trainyard.config import GateConfig
from trainyard.errors import ConfigError, EvaluationError
from trainyard.evaluation.gate import ForceRequest, required_metrics
from trainyard.evaluation.metrics import compute_metrics, evaluate_model, metrics_with_slices
from trainyard.evaluation.step import run_gate

RNG = np.random.default_rng(7)
N, DIM, CLASSES = 300, 4, 3
W_TRUE = RNG.normal(size=(DIM, CLASSES)).astype(np.float32)
W_WORSE = (W_TRUE + RNG.normal(scale=0.3, size=W_TRUE.shape)).astype(np.float32)
X = RNG.normal(size=(N, DIM)).astype(np.float32)
_flip = RNG.random(N) < 0.15
LABELS = np.where(_flip, RNG.integers(0, CLASSES, N), (X @ W_TRUE).argmax(axis=1)).astype(np.int64)
GROUP = np.where(np.arange(N) % 3 == 0, "north", "south")


@dataclasses.dataclass
class Examples:
    features: dict[str, np.ndarray]
    labels: np.ndarray
    keys: list[str]


EXAMPLES = Examples({"x": X}, LABELS, [f"{c}/img_{i}" for i, c in enumerate(LABELS)])


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def save_linear(
    path: Path, weights: np.ndarray, input_name: str = "x", regression: bool = False
) -> Path:
    import tensorflow as tf

    class Linear(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(
            input_signature=[tf.TensorSpec([None, weights.shape[0]], tf.float32, name=input_name)]
        )
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            z = tf.matmul(x, self.w)
            if regression:
                return {"predictions": z[:, 0]}
            p = tf.nn.softmax(z)
            return {"probabilities": p, "class_id": tf.argmax(p, axis=1, output_type=tf.int64)}

    module = Linear()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / "saved_model.pb").write_bytes(b"this is not a protobuf")
    return {
        "good": save_linear(root / "good", W_TRUE),
        "worse": save_linear(root / "worse", W_WORSE),
        "image_input": save_linear(root / "image_input", W_TRUE, input_name="image"),
        "regressor": save_linear(root / "regressor", W_TRUE[:, :1].copy(), regression=True),
        "corrupt": corrupt,
    }


# ------------------------------------------------------------------ numpy metrics


@pytest.mark.parametrize(
    ("labels", "probs"),
    [
        (np.array([0, 0, 1, 1]), np.array([[0.9, 0.1], [0.6, 0.4], [0.35, 0.65], [0.2, 0.8]])),
        (np.array([0, 1, 1, 0, 1]), np.array([[0.5, 0.5]] * 5)),  # all tied
        (np.array([1, 0, 1, 0, 1, 1]), np.array([[0.3], [0.3], [0.8], [0.1], [0.3], [0.9]])),
        (LABELS, softmax(X @ W_TRUE)),
        (LABELS, np.round(softmax(X @ W_WORSE), 1)),  # many ties
    ],
    ids=["binary", "binary all ties", "sigmoid column with ties", "multiclass", "multiclass ties"],
)
def test_auc_and_loss_match_sklearn(labels: np.ndarray, probs: np.ndarray) -> None:
    got = compute_metrics({"probabilities": probs}, labels, ["auc", "loss", "accuracy"])
    if probs.shape[1] == 1:
        want_auc = roc_auc_score(labels, probs[:, 0])
        want_loss = log_loss(labels, np.clip(probs[:, 0], 1e-7, 1 - 1e-7))
        want_acc = np.mean((probs[:, 0] >= 0.5) == labels)
    elif probs.shape[1] == 2:
        want_auc = roc_auc_score(labels, probs[:, 1])
        want_loss = log_loss(labels, probs)
        want_acc = np.mean(probs.argmax(axis=1) == labels)
    else:
        # one-vs-rest macro AUC, as roc_auc_score(multi_class="ovr") defines it
        want_auc = np.mean([roc_auc_score(labels == c, probs[:, c]) for c in range(CLASSES)])
        want_loss = log_loss(labels, probs / probs.sum(axis=1, keepdims=True), labels=[0, 1, 2])
        want_acc = np.mean(probs.argmax(axis=1) == labels)
    assert got["auc"] == pytest.approx(want_auc, abs=1e-12)
    assert got["accuracy"] == pytest.approx(want_acc)
    if probs.shape[1] <= 2 or np.allclose(probs.sum(axis=1), 1):
        assert got["loss"] == pytest.approx(want_loss, rel=1e-6)


def test_regression_metrics_match_sklearn() -> None:
    y = RNG.normal(size=50)
    pred = y + RNG.normal(scale=0.3, size=50)
    got = compute_metrics({"predictions": pred[:, None]}, y, ["rmse", "mae", "loss"])
    assert got["rmse"] == pytest.approx(math.sqrt(mean_squared_error(y, pred)))
    assert got["mae"] == pytest.approx(mean_absolute_error(y, pred))
    assert got["loss"] == pytest.approx(mean_squared_error(y, pred))


@pytest.mark.parametrize(
    ("outputs", "labels", "metrics", "error", "match"),
    [
        (
            {"probabilities": np.eye(2)},
            np.array([0, 1]),
            ["f1"],
            ConfigError,
            "unknown gate metric",
        ),
        ({"probabilities": np.eye(2)}, np.array([0, 1]), ["rmse"], EvaluationError, "regression"),
        ({"predictions": np.zeros(2)}, np.zeros(2), ["auc"], EvaluationError, "classifier"),
        ({"logits": np.zeros(2)}, np.zeros(2), ["loss"], EvaluationError, "neither"),
    ],
    ids=["unknown metric", "rmse of a classifier", "auc of a regressor", "unknown outputs"],
)
def test_metric_errors(
    outputs: dict[str, np.ndarray],
    labels: np.ndarray,
    metrics: list[str],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        compute_metrics(outputs, labels, metrics)


def test_auc_undefined_for_single_class_is_nan() -> None:
    got = compute_metrics(
        {"probabilities": np.array([[0.2, 0.8], [0.4, 0.6]])}, np.array([1, 1]), ["auc"]
    )
    assert math.isnan(got["auc"])


def test_slices_and_bad_labels_named() -> None:
    probs = softmax(X @ W_TRUE)
    got = metrics_with_slices(
        {"probabilities": probs}, LABELS, EXAMPLES.keys, ["accuracy"], {"group": GROUP}
    )
    for g in ("north", "south"):
        mask = np.asarray(GROUP) == g
        assert got[f"accuracy@group={g}"] == pytest.approx(
            np.mean(probs[mask].argmax(1) == LABELS[mask])
        )
    bad = LABELS.copy()
    bad[5] = 7
    with pytest.raises(
        EvaluationError, match=r"holdout row 5 \(key '.*/img_5'\), column label: value 7"
    ):
        metrics_with_slices({"probabilities": probs}, bad, EXAMPLES.keys, ["accuracy"])
    with pytest.raises(EvaluationError, match="slice column 'group' has 3 values for 300 rows"):
        metrics_with_slices(
            {"probabilities": probs}, LABELS, EXAMPLES.keys, ["accuracy"], {"group": GROUP[:3]}
        )


def test_required_metrics_collects_every_metric_the_gate_reads() -> None:
    gate = GateConfig.model_validate(
        {
            "metrics": ["accuracy"],
            "thresholds": {"loss": {"max": 1.0}, "auc@group=north": {"min": 0.5}},
            "champion": {"metric": "mae", "higher_is_better": False},
        }
    )
    assert required_metrics(gate) == ["accuracy", "loss", "auc", "mae"]


# ------------------------------------------------------------------ real SavedModels


def test_evaluate_model_on_real_savedmodel(models: dict[str, Path]) -> None:
    got = evaluate_model(
        models["good"],
        EXAMPLES,
        ["accuracy", "loss", "auc"],
        slices=["group"],
        slice_values={"group": GROUP},
    )
    probs = softmax(X.astype(np.float64) @ W_TRUE)
    assert got["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == LABELS))
    assert got["loss"] == pytest.approx(log_loss(LABELS, probs), rel=1e-4)
    assert got["auc"] == pytest.approx(roc_auc_score(LABELS, probs, multi_class="ovr"), abs=1e-4)
    assert {k for k in got if "@" in k} == {
        f"{m}@group={g}" for m in ("accuracy", "loss", "auc") for g in ("north", "south")
    }
    # batching does not change the result
    assert evaluate_model(
        models["good"], EXAMPLES, ["accuracy", "loss"], batch_size=7
    ) == pytest.approx({k: got[k] for k in ("accuracy", "loss")})


def test_evaluate_regressor(models: dict[str, Path]) -> None:
    targets = (X @ W_TRUE[:, 0]) + 0.5
    ex = Examples({"x": X}, targets, EXAMPLES.keys)
    got = evaluate_model(models["regressor"], ex, ["rmse", "mae"])
    assert got["rmse"] == pytest.approx(0.5, rel=1e-5) and got["mae"] == pytest.approx(
        0.5, rel=1e-5
    )


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ("corrupt", "cannot load a serving_default signature"),
        ("image_input", r"model inputs \['image'\] are not in the examples' features \['x'\]"),
    ],
    ids=["corrupt SavedModel", "inputs do not fit"],
)
def test_evaluate_model_errors(models: dict[str, Path], model: str, match: str) -> None:
    with pytest.raises(EvaluationError, match=match):
        evaluate_model(models[model], EXAMPLES, ["accuracy"])


GATE = GateConfig.model_validate(
    {
        "metrics": ["accuracy", "loss", "auc"],
        "thresholds": {"accuracy": {"min": 0.6}},
        "champion": {"metric": "accuracy", "max_regression": 0.01},
        "slices": ["group"],
    }
)


@pytest.mark.parametrize(
    ("candidate", "champion", "force", "verdict", "reason"),
    [
        ("good", None, False, "promote", "first run"),
        ("good", "worse", False, "promote", "vs champion"),
        ("good", "good", False, "promote", "All"),
        ("worse", "good", False, "reject", "champion:accuracy"),
        ("worse", "good", True, "forced", "Forced by carol"),
        ("good", "corrupt", False, "reject", "champion evaluation failed: EvaluationError"),
        ("image_input", None, False, "reject", "candidate evaluation failed: EvaluationError: "),
        ("corrupt", "good", False, "reject", "cannot load a serving_default signature"),
    ],
    ids=[
        "first run",
        "better than champion",
        "equal to champion",
        "worse than champion",
        "worse but forced",
        "champion unreadable",
        "candidate inputs do not fit",
        "candidate corrupt",
    ],
)
def test_run_gate_with_real_models(
    models: dict[str, Path],
    candidate: str,
    champion: str | None,
    force: bool,
    verdict: str,
    reason: str,
) -> None:
    req = ForceRequest("carol", "incident 42", "2026-11-21T08:00:00Z") if force else None
    decision = run_gate(
        GATE,
        models[candidate],
        models[champion] if champion else None,
        EXAMPLES,
        {"group": GROUP},
        req,
        5,
    )
    assert decision.verdict == verdict, decision.reason
    assert reason in decision.reason
    assert decision.first_run is (champion is None)
    assert set(decision.timings) == {"candidate_seconds"} | (
        {"champion_seconds"} if champion else set()
    )
    if candidate in ("good", "worse"):
        probs = softmax(X @ (W_TRUE if candidate == "good" else W_WORSE))
        assert decision.smoke == {
            "keys": EXAMPLES.keys[:5],
            "class_ids": probs[:5].argmax(1).tolist(),
        }
        assert "accuracy@group=north" in decision.candidate_metrics
    else:
        assert decision.smoke is None
    assert decision.to_json()  # strict JSON even with NaN or missing metrics


def test_run_gate_without_slice_values_rejects(models: dict[str, Path], tmp_path: Path) -> None:
    decision = run_gate(GATE, models["good"], None, EXAMPLES, {}, None)
    assert decision.verdict == "reject"
    assert "slice column(s) ['group'] have no values" in decision.reason
    # the candidate directory is never modified by evaluation
    copy = shutil.copytree(models["good"], tmp_path / "copy")
    run_gate(GATE, copy, None, EXAMPLES, {"group": GROUP}, None)
    assert sorted(p.name for p in copy.rglob("*")) == sorted(
        p.name for p in models["good"].rglob("*")
    )


# ------------------------------------------------------------------ the evaluate step, end to end

PIPELINE_YAML = """
name: digits
dataset: digits
start_date: 2026-11-01
source: {{url: {url}, format: image_folder}}
training: {{model: small_cnn}}
gate:
  metrics: [accuracy, loss, auc]
  thresholds: {{accuracy: {{min: 0.0}}}}
  champion: {{metric: accuracy, max_regression: 0.0}}
  slices: [label, width]
serving: {{model_name: digits, smoke_rows: 4}}
"""


def test_evaluate_and_decide_on_a_staged_snapshot(
    volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    from trainyard.config import load_pipeline
    from trainyard.evaluation.step import evaluate_and_decide, smoke_examples
    from trainyard.registry import Registry
    from trainyard.settings import get_settings
    from trainyard.staging import stage

    raw = tmp_path / "raw"
    rng = np.random.default_rng(3)
    for digit in range(10):
        (raw / str(digit)).mkdir(parents=True)
        for i in range(12):
            pixels = (rng.random((8, 8)) * 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(raw / str(digit) / f"img_{digit}_{i}.png")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "digits.yaml").write_text(PIPELINE_YAML.format(url=raw))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    cfg = load_pipeline("digits")
    snap = stage(cfg, quiet=True)
    w = rng.normal(size=(64, 10)).astype(np.float32)
    model = tmp_path / "model"
    _save_image_model(model, w)
    reg = Registry(get_settings().models_root, cfg)
    meta = {"dataset": "digits", "snapshot_id": snap.snapshot_id}
    v1 = reg.register(model, meta)

    first = evaluate_and_decide(cfg, reg, v1)
    assert (first.verdict, first.first_run, first.version, first.champion_version) == (
        "promote",
        True,
        1,
        None,
    ), first.reason
    assert {"accuracy@label=0", "accuracy@label=9", "accuracy@width=8"} <= set(
        first.candidate_metrics
    )
    gate_json = reg.read_file(v1, "gate.json")
    assert gate_json is not None and gate_json["verdict"] == "promote"
    assert (
        "Gate: PROMOTE (version 1 vs no champion)" in (reg.version_dir(v1) / "gate.md").read_text()
    )
    assert len(first.smoke["class_ids"]) == 4

    reg.promote(v1, "first run", "test")
    v2 = reg.register(model, meta)
    second = evaluate_and_decide(cfg, reg, v2)
    assert (second.verdict, second.first_run, second.champion_version) == ("promote", False, 1)
    assert second.champion_metrics == pytest.approx(second.candidate_metrics, nan_ok=True)

    smoke = smoke_examples(cfg, reg, v2, 4)
    assert smoke.keys == second.smoke["keys"]
    assert smoke.expected["class_id"] == second.smoke["class_ids"]
    assert smoke.features["image"].shape == (4, 8, 8, 1)
    flat = smoke.features["image"].reshape(4, 64)
    assert smoke.expected["class_id"] == (flat @ w).argmax(1).tolist()

    # a champion trained for another task (its metrics.json says so) is not compared
    reg.promote(v2, "second", "test")
    (reg.version_dir(v2) / "metrics.json").write_text('{"task": "regression"}')
    v3 = reg.register(model, meta)
    other = evaluate_and_decide(cfg, reg, v3)
    assert (other.verdict, other.first_run, other.champion_version) == ("promote", False, 2)
    assert "champion v2 is a regression model" in other.reason
    assert other.champion_metrics is None

    reg.pointer.write_text("{broken")
    third = evaluate_and_decide(cfg, reg, v2)
    assert third.verdict == "reject"
    assert "champion unreadable" in third.reason
    assert reg.read_file(v2, "gate.json")["verdict"] == "reject"

    # found by a cold user: a flipped byte in a shard gave a gate computed on the flipped
    # rows, and the deploy's smoke test a decoder's traceback (exit 1: retried)
    from trainyard.errors import SnapshotError

    shard = next(p for p in sorted(Path(snap.path).rglob("*")) if p.name.startswith("shard-"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    damaged = evaluate_and_decide(cfg, reg, v3)
    assert damaged.verdict == "reject"
    assert f"SnapshotError: snapshot {snap.snapshot_id} damaged: shard" in damaged.reason
    with pytest.raises(SnapshotError, match="content hash differs from the manifest"):
        smoke_examples(cfg, reg, v3, 4)


def _save_image_model(path: Path, weights: np.ndarray) -> None:
    import tensorflow as tf

    class Flat(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")])
        def serve(self, image: tf.Tensor) -> dict[str, tf.Tensor]:
            p = tf.nn.softmax(tf.matmul(tf.reshape(image, [-1, 64]), self.w))
            return {"probabilities": p, "class_id": tf.argmax(p, axis=1, output_type=tf.int64)}

    module = Flat()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def test_importing_evaluation_and_registry_loads_no_heavy_module() -> None:
    import subprocess
    import sys

    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    code = (
        f"import sys; sys.path.insert(0, {plugins!r}); "
        "import trainyard.evaluation, trainyard.registry; "
        "print(sorted(m for m in ('tensorflow', 'pandas', 'great_expectations', 'sklearn') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_diagnostics_confusion_matrix_matches_sklearn() -> None:
    from sklearn.metrics import confusion_matrix

    from trainyard.evaluation.metrics import diagnostics

    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 500)
    probs = rng.random((500, 4))
    diag = diagnostics({"probabilities": probs}, y)
    assert diag is not None and diag["kind"] == "confusion" and diag["classes"] == 4
    want = confusion_matrix(y, probs.argmax(axis=1), labels=range(4))
    assert diag["matrix"] == want.tolist()
    # a binary model with one sigmoid output still gets a 2x2 matrix
    one = diagnostics({"probabilities": np.array([[0.9], [0.2], [0.7]])}, np.array([1, 1, 0]))
    assert one is not None and one["matrix"] == [[0, 1], [1, 1]]
    many = diagnostics({"probabilities": rng.random((10, 60))}, np.arange(10))
    assert many is not None and many["matrix"] is None and many["classes"] == 60
    assert diagnostics({"probabilities": np.zeros((0, 3))}, np.zeros(0)) is None


def test_diagnostics_residuals_histogram_counts_every_finite_row() -> None:
    from trainyard.evaluation.metrics import RESIDUAL_BINS, diagnostics

    rng = np.random.default_rng(4)
    target = rng.normal(100, 10, 1000)
    pred = target + rng.normal(2.0, 1.0, 1000)
    pred[0] = np.nan  # an unusable row is left out, not counted
    pred[1] = target[1] + 1e6  # an outlier lands in the last bin instead of stretching it
    diag = diagnostics({"predictions": pred.reshape(-1, 1)}, target)
    assert diag is not None and diag["kind"] == "residuals"
    assert len(diag["counts"]) == RESIDUAL_BINS and sum(diag["counts"]) == diag["n"] == 999
    assert diag["edges"][-1] < 10 and diag["counts"][-1] >= 1
    assert diag["p50"] == pytest.approx(2.0, abs=0.2)
    constant = diagnostics({"predictions": np.ones(5)}, np.ones(5))
    assert constant is not None and sum(constant["counts"]) == 5
