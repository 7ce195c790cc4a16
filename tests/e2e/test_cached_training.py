"""Retrain only when it matters, reproducibly (issue 38), on the cheapest real path.

``python -m trainyard run`` on the digits pipeline (real staging, validation, TensorFlow
workers, gate, model server), five times on one unchanged snapshot and once with another
config:

* the second and third runs train nothing (0 s), reuse version 1, gate it again (kept)
  and the server still serves version 1;
* a ``--force-retrain`` run trains again and gives the first training's metrics, on the
  holdout and in training (same fingerprint, same weights);
* a changed config (``epochs``) trains, and says what changed.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.support.harness import Project, make_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    proj = make_project(tmp_path_factory.mktemp("cached"), {"training": {"epochs": 2}})
    yield proj
    proj.stop_server()


def _run(project: Project, *args: str) -> dict:
    out = project.trainyard("run", "--pipeline", "digits", *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    record = json.loads((project.volume_root / "_models/digits/last_run.json").read_text())
    record["printed"] = out.stdout
    return record


def _served(project: Project) -> list[str]:
    url = f"http://127.0.0.1:{project.port}/v1/models/digits"
    with urllib.request.urlopen(url, timeout=10) as resp:
        status = json.loads(resp.read())["model_version_status"]
    return [s["version"] for s in status if s["state"] == "AVAILABLE"]


def _versions(project: Project) -> list[str]:
    return sorted(p.name for p in Path(project.volume_root, "_models/digits/versions").iterdir())


def test_unchanged_runs_reuse_forced_ones_reproduce_a_changed_config_retrains(
    project: Project,
) -> None:
    first = _run(project)
    assert first["train"]["reused"] is False and first["train"]["seconds"] > 0
    assert first["deploy"]["version"] == 1

    for _ in range(2):  # the nightly run on unchanged data
        again = _run(project)
        train = again["train"]
        assert (train["version"], train["reused"], train["seconds"]) == (1, True, 0.0)
        assert train["decision"] == (
            "unchanged since version 1 (same snapshot, config, code): reused, 0 s"
        )
        assert again["evaluate"]["verdict"] == "keep", again["evaluate"]["reason"]
        assert "deploy" not in again
        assert _served(project) == ["1"]
        assert _versions(project) == ["1"]
        printed = again["printed"]
        assert "training      unchanged since version 1" in printed
        assert "data          trained on 1797 rows from 1 interval" in printed
        assert "served        version 1 at 127.0.0.1:" in printed

    forced = _run(project, "--force-retrain")  # the same snapshot, config and code as v1
    assert forced["train"]["version"] == 2
    assert not forced["train"]["reused"] and forced["train"]["seconds"] > 0
    assert "retrains on purpose (force_retrain)" in forced["train"]["decision"]
    assert forced["evaluate"]["metrics"] == first["evaluate"]["metrics"]
    assert forced["train"]["metrics"]["loss"] == first["train"]["metrics"]["loss"]
    assert forced["train"]["metrics"]["accuracy"] == first["train"]["metrics"]["accuracy"]
    meta = {
        v: json.loads(
            (project.volume_root / f"_models/digits/versions/{v}/metadata.json").read_text()
        )
        for v in (1, 2)
    }
    assert meta[2]["determinism"] == {"deterministic": True, "op_determinism": True, "why": []}
    assert meta[2]["fingerprint"]["digest"] == meta[1]["fingerprint"]["digest"]

    changed = _run(project, "--overrides", json.dumps({"epochs": 1}))
    assert changed["train"]["version"] == 3 and not changed["train"]["reused"]
    assert changed["train"]["decision"].startswith("trains: config changed since version")
