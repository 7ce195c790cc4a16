"""``tracking: mlflow`` end to end: real trainings mirrored into a real MLflow server.

The digits pipeline (1 worker, 2 epochs) with ``tracking:`` and the connection as
``AIRFLOW_CONN_MLFLOW_TEST``: ``run`` trains, gates and deploys version 1; ``train`` and
``evaluate`` (the tracker down: its mirror is missed) make a gated candidate 2, which
``models promote`` completes in MLflow and makes champion; ``models rollback`` moves the
champion back (2, rolled back from, is no challenger). After each, MLflow's REST API
shows what trainyard's registry says: one run per version with its parameters, per-epoch
curves and gate report, a model version per trainyard version, ``champion`` and
``challenger`` where the registry has them. A server that is down costs one warning and
the command still succeeds.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.support.harness import make_project
from tests.support.mlflow_server import (
    aliases,
    artifact,
    history,
    mlflow_server,
    model_versions,
    run_of_version,
    runs_of,
    tags,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXPERIMENT = "trainyard/digits"


def test_trainings_promotions_and_rollbacks_are_mirrored(tmp_path: Path) -> None:
    with mlflow_server(tmp_path / "mlflow") as url:
        (tmp_path / "project").mkdir()
        proj = make_project(
            tmp_path / "project",
            pipeline_overrides={
                "training": {"epochs": 2, "workers": 1},
                # both candidates pass whatever the seed gives: the mirror is tested here
                "gate": {"thresholds": {"accuracy": {"min": 0.3}}, "champion": None},
                "tracking": {"backend": "mlflow", "conn_id": "mlflow_test"},
            },
        )
        proj.env["AIRFLOW_CONN_MLFLOW_TEST"] = url
        try:
            out = proj.trainyard("run", "--pipeline", "digits", timeout=600)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
            (run,) = run_of_version(url, EXPERIMENT, 1)
            run_id = run["info"]["run_id"]
            params = {p["key"]: p["value"] for p in run["data"]["params"]}
            meta = json.loads(
                (proj.volume_root / "_models/digits/versions/1/metadata.json").read_text()
            )
            assert params["training.epochs"] == "2"
            assert params["training.workers"] == "1"
            assert params["snapshot_id"] == meta["snapshot_id"]
            assert params["contract_version"] == meta["contract_version"]
            curve = history(url, run_id, "loss")
            assert [step for step, _ in curve] == [0, 1]
            assert history(url, run_id, "accuracy")[-1][1] == pytest.approx(
                meta["train_metrics"]["accuracy"]
            )
            gate = json.loads(artifact(url, run, "gate.json"))
            assert gate["verdict"] == "promote"
            assert artifact(url, run, "gate.md").startswith(b"#")
            assert len(artifact(url, run, "model/saved_model.pb")) > 1000
            evals = history(url, run_id, "eval_accuracy")
            assert evals == [(0, pytest.approx(gate["candidate_metrics"]["accuracy"]))]
            assert tags(run)["trainyard.verdict"] == "promote"
            assert run["info"]["status"] == "FINISHED"
            assert aliases(url, "digits") == {"champion": 1}

            snapshot = meta["snapshot_id"]
            out = proj.trainyard(  # the same inputs: a second version only when forced
                "train",
                "--pipeline",
                "digits",
                "--snapshot-id",
                snapshot,
                "--run-id",
                "second",
                "--force-retrain",
                "true",
            )
            assert out.returncode == 0, out.stderr[-3000:]
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                down = f"http://127.0.0.1:{s.getsockname()[1]}"
            # evaluate while the tracker is down: v2's run stays partial (no gate) ...
            proj.env["AIRFLOW_CONN_MLFLOW_TEST"] = down
            out = proj.trainyard("evaluate", "--pipeline", "digits", "--version", "2")
            assert out.returncode == 0, out.stderr[-3000:]
            assert out.stderr.count("MLflow mirror of digits version 2 skipped") == 1, out.stderr
            proj.env["AIRFLOW_CONN_MLFLOW_TEST"] = url
            (two,) = run_of_version(url, EXPERIMENT, 2)
            assert "trainyard.verdict" not in tags(two)
            assert aliases(url, "digits") == {"champion": 1}

            # ... until the next mirror, here models promote, completes it
            out = proj.trainyard("models", "promote", "--pipeline", "digits", "2", "--reason", "t")
            assert out.returncode == 0, out.stderr[-3000:]
            assert aliases(url, "digits") == {"champion": 2}
            (two,) = run_of_version(url, EXPERIMENT, 2)
            gate2 = json.loads(artifact(url, two, "gate.json"))
            assert tags(two)["trainyard.verdict"] == gate2["verdict"] == "promote"
            assert tags(two)["trainyard.mirrored"] == "training;gate=promote"
            assert history(url, two["info"]["run_id"], "eval_accuracy") == [
                (0, pytest.approx(gate2["candidate_metrics"]["accuracy"]))
            ]
            out = proj.trainyard("models", "rollback", "--pipeline", "digits", "--reason", "t")
            assert out.returncode == 0, out.stderr[-3000:]
            assert aliases(url, "digits") == {"champion": 1}  # rolled back from: no challenger

            # every command mirrored again; still one run and one model version per version
            assert sorted(tags(r)["trainyard.version"] for r in runs_of(url, EXPERIMENT)) == [
                "1",
                "2",
            ]
            assert len(model_versions(url, "digits")) == 2
            assert [step for step, _ in history(url, run_id, "loss")] == [0, 1]

            # the tracker down: one warning naming it, the promotion happens all the same
            proj.env["AIRFLOW_CONN_MLFLOW_TEST"] = down
            out = proj.trainyard("models", "promote", "--pipeline", "digits", "2", "--reason", "t")
            assert out.returncode == 0, out.stderr[-3000:]
            assert out.stderr.count("MLflow mirror of digits skipped") == 1, out.stderr
            assert down in out.stderr
            champion = json.loads((proj.volume_root / "_models/digits/champion.json").read_text())
            assert champion["version"] == 2
            assert aliases(url, "digits") == {"champion": 1}  # not reached
        finally:
            proj.stop_server()
