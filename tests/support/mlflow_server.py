"""A real MLflow tracking server for tests, and reads of what it holds (its REST API).

The server comes from ``.trainyard/tools/mlflow`` (``scripts/mlflow_server.sh``, run by
``make test``): MLflow 3 on loopback, SQLite backend and artifact proxy in the test's
folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = ROOT / ".trainyard" / "tools" / "mlflow" / "bin" / "mlflow"


@contextmanager
def mlflow_server(
    folder: Path, startup_s: float = 90.0, serve_artifacts: bool = True
) -> Iterator[str]:
    """Run ``mlflow server`` on a free loopback port until the block ends.

    Args:
        folder: Where its SQLite database, artifacts and log go.
        startup_s: How long ``/health`` may take to answer.
        serve_artifacts: False starts it with ``--no-serve-artifacts`` (artifacts under
            ``folder/mlruns``, not through the server).

    Yields:
        The server's base URL.
    """
    if not MLFLOW.is_file():
        raise RuntimeError(
            f"{MLFLOW} is missing: run `bash scripts/mlflow_server.sh` (make test does) to "
            "install the MLflow server these tests start"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = folder / "mlflow-server.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(MLFLOW),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{folder / 'mlflow.db'}",
                *(
                    ["--artifacts-destination", str(folder / "artifacts")]
                    if serve_artifacts
                    else ["--no-serve-artifacts", "--default-artifact-root", str(folder / "mlruns")]
                ),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            start_new_session=True,
            # trainyard mirrors runs and versions, and uses no MLflow job: without this the
            # server started seven job consumers, each importing MLflow (~30 s of CPU)
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not up in {startup_s}s: {log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def api(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """Call the server's REST API (``path`` after ``/api/2.0/``); GET takes query args."""
    url = f"{base}/api/2.0/{path}"
    data = None
    if method == "GET" and body:
        url += "?" + urllib.parse.urlencode(body)
    elif body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if path.startswith("mlflow/") else raw


def runs_of(base: str, experiment: str) -> list[dict[str, Any]]:
    """Every run of an experiment (by name)."""
    exp = api(base, "GET", "mlflow/experiments/get-by-name", {"experiment_name": experiment})
    found = api(
        base,
        "POST",
        "mlflow/runs/search",
        {"experiment_ids": [exp["experiment"]["experiment_id"]], "max_results": 100},
    )
    return found.get("runs") or []


def tags(run: dict[str, Any]) -> dict[str, str]:
    """A run's tags as a dict."""
    return {t["key"]: t["value"] for t in run["data"].get("tags") or []}


def run_of_version(base: str, experiment: str, version: int) -> list[dict[str, Any]]:
    """The runs tagged as mirroring a trainyard version."""
    return [
        r for r in runs_of(base, experiment) if tags(r).get("trainyard.version") == str(version)
    ]


def history(base: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's (step, value) points."""
    got = api(base, "GET", "mlflow/metrics/get-history", {"run_id": run_id, "metric_key": key})
    return sorted((int(m["step"]), float(m["value"])) for m in got.get("metrics") or [])


def artifact(base: str, run: dict[str, Any], name: str) -> bytes:
    """Download one artifact of a run through the server's proxy."""
    uri = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    return api(base, "GET", f"mlflow-artifacts/artifacts/{uri}/{name}")


def aliases(base: str, model: str) -> dict[str, int]:
    """Alias → trainyard version of a registered model (via each version's tag)."""
    reg = api(base, "GET", "mlflow/registered-models/get", {"name": model})["registered_model"]
    out = {}
    for item in reg.get("aliases") or []:
        mv = api(
            base,
            "GET",
            "mlflow/model-versions/get",
            {"name": model, "version": item["version"]},
        )["model_version"]
        tv = {t["key"]: t["value"] for t in mv.get("tags") or []}
        out[item["alias"]] = int(tv["trainyard.version"])
    return out


def model_versions(base: str, model: str) -> list[dict[str, Any]]:
    """Every version of a registered model."""
    got = api(base, "GET", "mlflow/model-versions/search", {"filter": f"name='{model}'"})
    return got.get("model_versions") or []
