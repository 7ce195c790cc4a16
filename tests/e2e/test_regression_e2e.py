"""A regression dataset the project does not ship, end to end: scikit-learn's diabetes data.

442 patients, 10 numeric features, a numeric target (disease progression, 25-346), as one
CSV for one day, with a contract that says ``roles.task: regression``. The pipeline trains
a regressor (standardised target, mean squared error), gates it on RMSE and R², deploys it,
and the server answers numbers; a gate whose RMSE bound no model meets rejects the next
candidate with that reason and the champion keeps serving. A pipeline gated on AUC is
refused before anything runs.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.daily_csv import pipeline as pipeline_dict
from tests.support.daily_csv import write_csv
from tests.support.harness import Project, make_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAY = "2026-11-01"
TARGET = "progression"


def _write_diabetes(raw: Path) -> list[dict[str, Any]]:
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    rows = [
        {"patient": f"p{i:03d}", **dict(zip(data.feature_names, map(float, x), strict=True)),
         TARGET: float(y)}
        for i, (x, y) in enumerate(zip(data.data, data.target, strict=True))
    ]  # fmt: skip
    raw.mkdir(parents=True)
    write_csv(raw / f"{DAY}.csv", rows)
    return rows


def _contract(features: list[str]) -> dict[str, Any]:
    return {
        "dataset": "diabetes",
        "version": "1.0.0",
        "owner": "tests@example.com",
        "source": {"format": "csv", "extension": "csv"},
        "columns": [
            {"name": "patient", "type": "string", "nullable": False, "unique": True},
            *({"name": f, "type": "float64", "nullable": False} for f in features),
            {"name": TARGET, "type": "float64", "nullable": False, "min": 0},
        ],
        "roles": {"key": "patient", "label": TARGET, "features": features, "task": "regression"},
        "rules": {"row_count": {"min": 100}},
        "split": {"holdout_fraction": 0.2, "by": "patient"},
    }


def _pipeline(raw: Path, port: int, rmse_max: float) -> dict[str, Any]:
    return pipeline_dict(
        raw,
        dataset="diabetes",
        training={"epochs": 10, "batch_size": 32, "learning_rate": 0.01, "workers": 2},
        gate={
            "metrics": ["rmse", "mae", "r2"],
            "thresholds": {"rmse": {"max": rmse_max}, "r2": {"min": 0.3}},
            "champion": {"metric": "rmse", "max_regression": 100.0},
        },
        serving={"model_name": "diabetes", "port": port},
    )


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    tmp = tmp_path_factory.mktemp("regression")
    proj = make_project(tmp)
    proj.rows = _write_diabetes(tmp / "raw")  # type: ignore[attr-defined]
    features = [k for k in proj.rows[0] if k not in ("patient", TARGET)]  # type: ignore[attr-defined]
    contracts = tmp / "contracts"
    contracts.mkdir()
    (contracts / "diabetes.yaml").write_text(yaml.safe_dump(_contract(features), sort_keys=False))
    proj.env["TRAINYARD_CONTRACTS_DIR"] = str(contracts)
    (tmp / "pipelines" / "digits.yaml").unlink()  # its contract is not in this folder
    proj.raw = tmp / "raw"  # type: ignore[attr-defined]
    yield proj
    proj.stop_server()


def _write_pipeline(project: Project, rmse_max: float) -> None:
    cfg = _pipeline(project.raw, project.port, rmse_max)  # type: ignore[attr-defined]
    (project.home / "pipelines" / "diabetes.yaml").write_text(yaml.safe_dump(cfg))


def test_a_regressor_trains_gates_on_rmse_and_serves_numbers(project: Project) -> None:
    _write_pipeline(project, rmse_max=70.0)
    out = project.trainyard("run", "--pipeline", "diabetes", "--ds", DAY, timeout=1100)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gate          promote" in out.stdout, out.stdout
    assert "run summary:" not in out.stderr  # printed once, on stdout
    # the workers' streamed output says what they did, not what TensorFlow prints on
    # start-up; GX's INFO logging about itself is left out
    streamed = [line for line in out.stderr.splitlines() if "[worker:" in line]
    assert any("Epoch" in line for line in streamed), streamed[-20:]
    assert not [line for line in streamed if "cudart_stub" in line or "cuInit" in line]
    assert "great_expectations._docs_decorators" not in out.stderr
    version = project.volume_root / "_models" / "diabetes" / "versions" / "1"
    metrics = json.loads((version / "metrics.json").read_text())
    assert metrics["task"] == "regression" and metrics["class_names"] is None
    assert math.isfinite(metrics["rmse"]) and "accuracy" not in metrics
    gate = json.loads((version / "gate.json").read_text())
    checks = {c["name"]: c for c in gate["checks"]}
    assert checks["threshold:rmse"]["passed"] and checks["threshold:rmse"]["candidate"] <= 70.0
    assert checks["threshold:r2"]["candidate"] >= 0.3  # better than predicting the mean
    assert set(gate["candidate_metrics"]) >= {"rmse", "mae", "r2"}
    residuals = gate["diagnostics"]  # drawn on the run page
    assert residuals["kind"] == "residuals" and sum(residuals["counts"]) == residuals["n"] > 0

    base = f"http://127.0.0.1:{project.port}/v1/models/diabetes"
    meta = _get(f"{base}/metadata")
    outputs = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["outputs"]
    assert list(outputs) == ["predictions"] and outputs["predictions"]["dtype"] == "DT_FLOAT"
    rows = project.rows[:20]  # type: ignore[attr-defined]
    features = [k for k in rows[0] if k not in ("patient", TARGET)]
    body = {"instances": [{f: r[f] for f in features} for r in rows]}
    predictions = _post(f"{base}:predict", body)["predictions"]
    assert len(predictions) == 20
    assert all(isinstance(p, float) and 0 < p < 500 for p in predictions), predictions
    assert len({round(p, 3) for p in predictions}) > 10  # not a constant
    truth = [r[TARGET] for r in rows]
    rmse = math.sqrt(sum((p - t) ** 2 for p, t in zip(predictions, truth, strict=True)) / 20)
    assert rmse < 90, (rmse, predictions, truth)
    columnar = _post(f"{base}:predict", {"inputs": {f: [rows[0][f]] for f in features}})
    assert columnar["outputs"] == pytest.approx(predictions[:1], rel=1e-5)
    assert "value " in out.stdout  # the summary's sample prediction is a number


def test_a_gate_the_regressor_misses_rejects_on_rmse(project: Project) -> None:
    _write_pipeline(project, rmse_max=1.0)
    out = project.trainyard(
        "run", "--pipeline", "diabetes", "--ds", DAY, "--force-retrain", timeout=1100
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gate          reject" in out.stdout and "rmse" in out.stdout, out.stdout
    registry = project.volume_root / "_models" / "diabetes"
    gate = json.loads((registry / "versions" / "2" / "gate.json").read_text())
    failed = [c["name"] for c in gate["checks"] if not c["passed"]]
    assert failed == ["threshold:rmse"], gate["checks"]
    assert json.loads((registry / "champion.json").read_text())["version"] == 1
    status = _get(f"http://127.0.0.1:{project.port}/v1/models/diabetes")
    assert [v["version"] for v in status["model_version_status"]] == ["1"]


def test_classifier_metrics_are_refused_for_a_regressor(project: Project) -> None:
    cfg = _pipeline(project.raw, project.port, 75.0)  # type: ignore[attr-defined]
    cfg["gate"]["thresholds"]["auc"] = {"min": 0.7}
    bad = project.home / "bad" / "diabetes.yaml"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text(yaml.safe_dump(cfg))
    out = project.trainyard("pipelines", "check", str(bad))
    assert out.returncode != 0
    assert "gate.thresholds.auc" in out.stdout + out.stderr
    assert "does not fit a regression model" in out.stdout + out.stderr
