"""Mirror trainyard's trainings into MLflow (``tracking: {backend: mlflow, conn_id: ...}``).

trainyard's registry (:mod:`trainyard.registry`) stays the source of truth; MLflow gets a
copy, through its REST API (``mlflow`` itself cannot be installed beside Airflow's pins):

* one run per trained version, in the pipeline's experiment, tagged ``trainyard.pipeline``
  and ``trainyard.version`` and found by those tags before anything is created, so
  mirroring a version again never makes a second run;
* its parameters (the effective training config, snapshot ids, contract version, config
  hash, code version), per-epoch metrics (``history.json``, step = epoch), the final
  training metrics and, once gated, the evaluation metrics (``eval_<metric>``);
* its artifacts, uploaded through the tracking server's artifact proxy
  (``mlflow-artifacts:``): the SavedModel (``model/``), ``metadata.json``,
  ``metrics.json``, ``history.json`` and, once gated, ``gate.json`` and ``gate.md``;
* a registered model version per trainyard version (``source`` = the run's ``model/``,
  tagged ``trainyard.version``), and the aliases ``champion`` (the registry's champion)
  and ``challenger`` (the newest version that passed its gate, is newer than the
  champion and was never rolled back from), set from the registry every time, so deploy,
  promote and rollback move them;
* a ``trainyard.mirrored`` tag written last (``training`` or ``training;gate=<verdict>``):
  every mirror completes the runs of the pipeline where it is absent or out of date (a
  mirror that failed or was killed halfway, a gate the tracker missed) besides the version
  at hand, the champion and the challenger, oldest first (MLflow's model version numbers
  then follow trainyard's where they can), under an ``flock`` on
  ``_models/<pipeline>/.mirror.lock`` so two runs of a pipeline never both create a run or
  model version.

A tracker that cannot be reached, answers an error or is not configured costs one warning
naming the URI; the step goes on as if tracking were off (:func:`mirror`). An experiment
that is deleted, or whose artifacts the server does not serve (``--no-serve-artifacts``),
is refused with that reason before any run is created.

Where the URI comes from (:func:`tracking_uri`): the Airflow connection ``conn_id`` as
Airflow passes connections through the environment, ``AIRFLOW_CONN_<CONN_ID>`` (URI or JSON
form; the local runner sets it for the step's process from Airflow's own lookup, so a
connection kept in Airflow's database works too), else ``MLFLOW_TRACKING_URI``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.connections import conn_env_name, read_connection
from trainyard.deadline import within
from trainyard.errors import ConfigError
from trainyard.fsutil import redact_url

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig, TrackingConfig
    from trainyard.registry import Registry

log = logging.getLogger("trainyard.tracking")

TAG_PIPELINE = "trainyard.pipeline"
TAG_VERSION = "trainyard.version"
TAG_RUN_ID = "trainyard.run_id"
TAG_VERDICT = "trainyard.verdict"
TAG_TRAINING_DONE = "trainyard.mirrored.training"
TAG_GATE_DONE = "trainyard.mirrored.gate"
TAG_COMPLETE = "trainyard.mirrored"
"""Written last, once a version is wholly mirrored: its value is :meth:`Mirror.state`."""
CHAMPION, CHALLENGER = "champion", "challenger"
PASSED = ("promote", "forced")
"""Gate verdicts that make a version a challenger."""

_ARTIFACT_SCHEME = "mlflow-artifacts:"
_PARAM_MAX = 6000  # MLflow's limit on a parameter value
_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_LOCK_FILE = ".mirror.lock"
_LOCK_WAIT_S = 600.0


class TrackingError(Exception):
    """The tracker could not be reached, refused a request, or is not configured."""


@dataclass(frozen=True)
class Endpoint:
    """Where the tracking server answers.

    Attributes:
        url: Base URL (``http(s)://host:port[/prefix]``), no credentials, no trailing slash.
        auth: An ``Authorization`` header value (basic auth from the connection), or None.
    """

    url: str
    auth: str | None = None


def _endpoint(conn_id: str, url: str, login: Any = None, password: Any = None) -> Endpoint:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TrackingError(
            f"connection {conn_id!r} gives {redact_url(url)!r}: trainyard speaks MLflow's REST API "
            "over http or https (give an http or https connection with the server's host and "
            "port)"
        )
    login = login if login is not None else parts.username
    password = password if password is not None else parts.password
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    auth = None
    if login:
        user = urllib.parse.unquote(str(login))
        secret = urllib.parse.unquote(str(password or ""))
        auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
    return Endpoint(url=base, auth=auth)


def tracking_uri(conn_id: str, environ: dict[str, str] | None = None) -> Endpoint:
    """The tracking server of a connection id.

    ``AIRFLOW_CONN_<CONN_ID>`` first (Airflow's environment form of a connection: a URI
    such as ``http://mlflow.internal:5000`` or ``https://user:pass@host/prefix``, or JSON
    ``{"conn_type": "http", "host": ..., "port": ..., "schema": <path prefix>, "login":
    ..., "password": ...}``), then ``MLFLOW_TRACKING_URI``.

    Args:
        conn_id: The pipeline's ``tracking.conn_id``.
        environ: The environment to read (default: this process's).

    Returns:
        The server's base URL and basic-auth header.

    Raises:
        TrackingError: Neither is set, or the value is not an http(s) address.
    """
    env = os.environ if environ is None else environ
    try:
        conn = read_connection(conn_id, env)
    except ConfigError as e:
        raise TrackingError(str(e)) from None
    if conn is not None:
        host, scheme = conn.host, conn.conn_type or "http"
        if "://" in host:  # the HTTP connection's habit: the scheme in the host field
            scheme, host = host.split("://", 1)
        if not host:
            shown = redact_url(env[conn_env_name(conn_id)])
            raise TrackingError(f"{conn_env_name(conn_id)} names no host: {shown!r}")
        netloc = host.rstrip("/") + (f":{conn.port}" if conn.port else "")
        path = conn.schema.strip("/")
        url = f"{scheme}://{netloc}" + (f"/{path}" if path else "")
        return _endpoint(conn_id, url, conn.login or None, conn.password or None)
    fallback = env.get("MLFLOW_TRACKING_URI", "").strip()
    if fallback:
        return _endpoint(conn_id, fallback)
    raise TrackingError(
        f"the Airflow connection {conn_id!r} is not available to this process (no "
        f"{conn_env_name(conn_id)} and no MLFLOW_TRACKING_URI in its environment)"
    )


class MlflowRest:
    """A small client of MLflow's REST API (``/api/2.0/mlflow/...``, artifact proxy).

    Args:
        endpoint: The server.
        timeout_s: Per-request timeout.
    """

    def __init__(self, endpoint: Endpoint, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> bytes:
        req = urllib.request.Request(
            self.endpoint.url + path, data=body, method=method, headers={"Accept": "*/*"}
        )
        if body is not None:
            req.add_header("Content-Type", content_type)
        if self.endpoint.auth:
            req.add_header("Authorization", self.endpoint.auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            code = ""
            with contextlib.suppress(ValueError, AttributeError):
                code = json.loads(text).get("error_code", "")
            raise MlflowHttpError(method, path, e.code, code, text[:300]) from e
        except (OSError, ValueError) as e:  # refused, timed out, DNS, TLS
            raise TrackingError(f"{method} {self.endpoint.url}{path}: {e}") from e

    def call(self, method: str, api: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Call ``/api/2.0/mlflow/<api>``: GET/DELETE take query args, POST/PATCH JSON.

        Returns:
            The decoded JSON answer (``{}`` when empty).
        """
        path = f"/api/2.0/mlflow/{api}"
        data = None
        if method == "GET" and body:
            path += "?" + urllib.parse.urlencode(body, doseq=True)
        elif body is not None:
            data = json.dumps(body).encode()
        raw = self._send(method, path, data)
        return json.loads(raw) if raw.strip() else {}

    def put_artifact(self, artifact_uri: str, name: str, data: bytes) -> None:
        """Upload one file under a run's ``mlflow-artifacts:`` URI through the proxy."""
        self._send("PUT", _proxy_path(artifact_uri, name), data, "application/octet-stream")

    def get_artifact(self, artifact_uri: str, name: str) -> bytes:
        """Download one file of a run (through the proxy)."""
        return self._send("GET", _proxy_path(artifact_uri, name))


class MlflowHttpError(TrackingError):
    """The server answered an HTTP error (``error_code`` is MLflow's, e.g. ``RESOURCE_...``)."""

    def __init__(self, method: str, path: str, status: int, error_code: str, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {error_code or ''} {text}".strip())
        self.status = status
        self.error_code = error_code


def _proxy_path(artifact_uri: str, name: str) -> str:
    if not artifact_uri.startswith(_ARTIFACT_SCHEME):
        raise TrackingError(
            f"the run's artifact location {artifact_uri!r} is not served by the tracking "
            "server (start it with --serve-artifacts, MLflow's default): trainyard uploads "
            "artifacts through its proxy only"
        )
    rel = artifact_uri[len(_ARTIFACT_SCHEME) :].lstrip("/")
    rel = f"{rel}/{name}".strip("/")
    return "/api/2.0/mlflow-artifacts/artifacts/" + urllib.parse.quote(rel)


# --------------------------------------------------------------------------- the mirror


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _flatten(f"{prefix}.{k}" if prefix else str(k), value[k])
    else:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        yield prefix, text[:_PARAM_MAX]


def version_params(meta: dict[str, Any]) -> dict[str, str]:
    """A version's MLflow parameters from its ``metadata.json``.

    Returns:
        ``training.<key>`` for the effective training config, ``snapshot_id``,
        ``snapshots`` (comma-separated ids), ``dataset``, ``contract_version``,
        ``config_hash``, ``code_version``, ``image``, ``rows``, ``data_until``,
        ``run_id``.
    """
    params = dict(_flatten("training", meta.get("training") or {}))
    snaps = meta.get("snapshots") or []
    params["snapshots"] = ",".join(str(s.get("snapshot_id")) for s in snaps)[:_PARAM_MAX]
    for key in (
        "snapshot_id",
        "dataset",
        "contract_version",
        "config_hash",
        "code_version",
        "image",
        "rows",
        "data_until",
        "run_id",
    ):
        if meta.get(key) is not None:
            params[key] = str(meta[key])[:_PARAM_MAX]
    return params


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def epoch_metrics(history: dict[str, Any], at_ms: int) -> list[dict[str, Any]]:
    """Per-epoch metrics of ``history.json`` as MLflow metrics (``step`` = epoch).

    Args:
        history: ``{"epochs": [{"epoch": 0, "loss": ..., ...}, ...]}``.
        at_ms: The timestamp every point gets (the version's registration time).

    Returns:
        One metric per numeric key of each epoch (``epoch`` and ``attempt`` left out).
    """
    out = []
    for row in history.get("epochs") or []:
        step = int(row.get("epoch", 0))
        for key, value in row.items():
            number = _number(value)
            if key in ("epoch", "attempt") or number is None:
                continue
            out.append({"key": key, "value": number, "timestamp": at_ms, "step": step})
    return out


def _ms(iso: Any) -> int:
    import datetime as dt

    try:
        return int(dt.datetime.fromisoformat(str(iso)).timestamp() * 1000)
    except ValueError:
        return int(time.time() * 1000)


def _start_ms(meta: dict[str, Any]) -> int:
    """When training started: the version's creation less its training time."""
    seconds = _number((meta.get("timings") or {}).get("train_seconds")) or 0.0
    return _ms(meta.get("created_at") or meta.get("registered_at")) - int(seconds * 1000)


class Mirror:
    """Mirrors one pipeline's registry into an MLflow server.

    Args:
        cfg: The pipeline (``cfg.tracking`` must be set).
        registry: Its registry.
        client: The REST client.
    """

    def __init__(self, cfg: PipelineConfig, registry: Registry, client: MlflowRest) -> None:
        assert cfg.tracking is not None
        self.cfg = cfg
        self.tracking: TrackingConfig = cfg.tracking
        self.registry = registry
        self.client = client
        self.experiment_name = self.tracking.experiment or f"trainyard/{cfg.name}"
        self.model_name = self.tracking.registered_model or cfg.name
        self._experiment_id: str | None = None

    # ---------------------------------------------------------------- lookups

    def experiment_id(self) -> str:
        """The pipeline's experiment, created on first use."""
        if self._experiment_id is not None:
            return self._experiment_id
        try:
            found = self.client.call(
                "GET", "experiments/get-by-name", {"experiment_name": self.experiment_name}
            )
            experiment = found["experiment"]
        except MlflowHttpError as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            try:
                self.client.call("POST", "experiments/create", {"name": self.experiment_name})
            except MlflowHttpError as made:  # another pipeline sharing the name made it first
                if made.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            found = self.client.call(
                "GET", "experiments/get-by-name", {"experiment_name": self.experiment_name}
            )
            experiment = found["experiment"]
        self._experiment_id = self._usable(experiment)
        return self._experiment_id

    def _usable(self, experiment: dict[str, Any]) -> str:
        """The experiment's id, once it is known to take runs and their artifacts.

        Checked before any run is created, so a refusal leaves nothing behind in MLflow.

        Raises:
            TrackingError: It is deleted (MLflow's raw answer would be "must be in the
                'active' state"), or its artifacts do not go through the server's proxy.
        """
        exp_id = str(experiment["experiment_id"])
        if experiment.get("lifecycle_stage", "active") != "active":
            raise TrackingError(
                f"the MLflow experiment {self.experiment_name!r} (id {exp_id}) is deleted: "
                "restore it in MLflow (UI, or `mlflow experiments restore --experiment-id "
                f"{exp_id}`), or set tracking.experiment to another name"
            )
        location = str(experiment.get("artifact_location") or "")
        if not location.startswith(_ARTIFACT_SCHEME):
            raise TrackingError(
                f"the MLflow experiment {self.experiment_name!r} keeps its artifacts at "
                f"{location!r}, which the tracking server does not serve: trainyard uploads "
                "artifacts through the server's artifact proxy only (start `mlflow server` "
                "without --no-serve-artifacts, MLflow's default; an experiment created while "
                "it was off keeps its location, so then also set tracking.experiment to a "
                "new name)"
            )
        return exp_id

    def find_run(self, version: int) -> dict[str, Any] | None:
        """The run mirroring ``version`` (by its trainyard tags), or None."""
        flt = (
            f"tags.`{TAG_PIPELINE}` = '{self.cfg.name}' and tags.`{TAG_VERSION}` = '{int(version)}'"
        )
        found = self.client.call(
            "POST",
            "runs/search",
            {"experiment_ids": [self.experiment_id()], "filter": flt, "max_results": 2},
        )
        runs = found.get("runs") or []
        if len(runs) > 1:
            log.warning(
                "MLflow holds %d runs of %s version %d; using the oldest",
                len(runs),
                self.cfg.name,
                version,
            )
            runs.sort(key=lambda r: int(r["info"].get("start_time") or 0))
        return runs[0] if runs else None

    def pipeline_runs(self) -> dict[int, dict[str, Any]]:
        """Every run of this pipeline in the experiment, by trainyard version (oldest kept)."""
        out: dict[int, dict[str, Any]] = {}
        token = None
        while True:
            args: dict[str, Any] = {
                "experiment_ids": [self.experiment_id()],
                "filter": f"tags.`{TAG_PIPELINE}` = '{self.cfg.name}'",
                "max_results": 1000,
                "order_by": ["attributes.start_time ASC"],
            }
            if token:
                args["page_token"] = token
            page = self.client.call("POST", "runs/search", args)
            for run in page.get("runs") or []:
                version = self._tags(run).get(TAG_VERSION, "")
                if version.isdigit():
                    out.setdefault(int(version), run)
            token = page.get("next_page_token")
            if not token:
                return out

    def state(self, version: int) -> str:
        """What a wholly mirrored version's ``trainyard.mirrored`` tag says.

        ``training`` (run, parameters, metrics, artifacts, model version), plus
        ``;gate=<verdict>`` once gated: a gate attached after the last mirror makes it out
        of date.
        """
        gate = self.registry.read_file(version, "gate.json")
        return "training" + (f";gate={gate.get('verdict')}" if gate is not None else "")

    def model_versions(self) -> dict[int, str]:
        """Map each trainyard version to its MLflow model version (of the registered model)."""
        out: dict[int, str] = {}
        token = None
        while True:
            args: dict[str, Any] = {"filter": f"name='{self.model_name}'", "max_results": 200}
            if token:
                args["page_token"] = token
            page = self.client.call("GET", "model-versions/search", args)
            for mv in page.get("model_versions") or []:
                tags = {t["key"]: t.get("value") for t in mv.get("tags") or []}
                if str(tags.get(TAG_VERSION, "")).isdigit():
                    out[int(tags[TAG_VERSION])] = str(mv["version"])
            token = page.get("next_page_token")
            if not token:
                return out

    # ---------------------------------------------------------------- writing

    def _tags(self, run: dict[str, Any]) -> dict[str, str]:
        return {t["key"]: t.get("value", "") for t in run.get("data", {}).get("tags") or []}

    def ensure_run(self, version: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The version's run, created (with its identifying tags) if MLflow has none."""
        run = self.find_run(version)
        if run is not None:
            return run
        tags = {
            TAG_PIPELINE: self.cfg.name,
            TAG_VERSION: str(int(version)),
            TAG_RUN_ID: str(meta.get("run_id") or ""),
            "mlflow.runName": f"{self.cfg.name}-v{int(version)}",
            "mlflow.source.name": "trainyard",
        }
        made = self.client.call(
            "POST",
            "runs/create",
            {
                "experiment_id": self.experiment_id(),
                "run_name": f"{self.cfg.name}-v{int(version)}",
                "start_time": _start_ms(meta),
                "tags": [{"key": k, "value": v} for k, v in tags.items()],
            },
        )
        log.info(
            "MLflow run %s mirrors %s version %d",
            made["run"]["info"]["run_id"],
            *(self.cfg.name, version),
        )
        return made["run"]

    def _log_batch(
        self,
        run_id: str,
        params: dict[str, str] | None = None,
        metrics: list[dict[str, Any]] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        items = list((params or {}).items())
        for i in range(0, len(items), _BATCH_PARAMS):
            chunk = items[i : i + _BATCH_PARAMS]
            self.client.call(
                "POST",
                "runs/log-batch",
                {"run_id": run_id, "params": [{"key": k, "value": v} for k, v in chunk]},
            )
        points = metrics or []
        for i in range(0, len(points), _BATCH_METRICS):
            self.client.call(
                "POST",
                "runs/log-batch",
                {"run_id": run_id, "metrics": points[i : i + _BATCH_METRICS]},
            )
        if tags:
            self.client.call(
                "POST",
                "runs/log-batch",
                {"run_id": run_id, "tags": [{"key": k, "value": v} for k, v in tags.items()]},
            )

    def _upload(self, artifact_uri: str, name: str, path: Path) -> None:
        if path.is_dir():
            for item in sorted(path.rglob("*")):
                if item.is_file():
                    rel = item.relative_to(path).as_posix()
                    self.client.put_artifact(artifact_uri, f"{name}/{rel}", item.read_bytes())
        elif path.is_file():
            self.client.put_artifact(artifact_uri, name, path.read_bytes())

    def mirror_version(self, version: int, run: dict[str, Any] | None = None) -> str:
        """Mirror one version: its run, training, gate (once gated) and model version.

        Each part is done once (the run's ``trainyard.mirrored.*`` tags say what is), so
        calling it again after every step adds only what is new; ``trainyard.mirrored``
        (:meth:`state`) is written last, once the run is FINISHED with its whole model and
        its model version exists.

        Args:
            version: The trainyard version.
            run: Its run as ``runs/search`` gave it (else looked up, or created).

        Returns:
            The run id.
        """
        version = int(version)
        meta = self.registry.metadata(version)
        folder = self.registry.version_dir(version)
        run = run or self.ensure_run(version, meta)
        info = run["info"]
        run_id, artifact_uri = info["run_id"], info["artifact_uri"]
        done = self._tags(run)
        # every point gets the registration time: MLflow keeps one copy of a point logged
        # again with the same key, value, step and timestamp, so a mirror retried after a
        # partial one (an upload that timed out) adds no duplicate points
        at_ms = _ms(meta.get("registered_at") or meta.get("created_at"))
        if done.get(TAG_TRAINING_DONE) != "1":
            history = self.registry.read_file(version, "history.json") or {}
            final = [
                {"key": f"train_{k}", "value": v, "timestamp": at_ms, "step": 0}
                for k, raw in sorted((meta.get("train_metrics") or {}).items())
                if (v := _number(raw)) is not None
            ]
            self._log_batch(
                run_id, params=version_params(meta), metrics=epoch_metrics(history, at_ms) + final
            )
            for name in ("metadata.json", "metrics.json", "history.json"):
                self._upload(artifact_uri, name, folder / name)
            self._upload(artifact_uri, "model", folder / "model")
            self.client.call(
                "POST",
                "runs/update",
                {"run_id": run_id, "status": "FINISHED", "end_time": at_ms},
            )
            self._log_batch(run_id, tags={TAG_TRAINING_DONE: "1"})
        elif info.get("status") == "RUNNING":  # whole, but left running: end it
            self.client.call(
                "POST",
                "runs/update",
                {"run_id": run_id, "status": "FINISHED", "end_time": at_ms},
            )
        gate = self.registry.read_file(version, "gate.json")
        if gate is not None and done.get(TAG_GATE_DONE) != str(gate.get("verdict")):
            evals = [
                {"key": f"eval_{k}", "value": v, "timestamp": at_ms, "step": 0}
                for k, raw in sorted((gate.get("candidate_metrics") or {}).items())
                if (v := _number(raw)) is not None
            ]
            self._log_batch(run_id, metrics=evals if not done.get(TAG_GATE_DONE) else [])
            for name in ("gate.json", "gate.md"):
                self._upload(artifact_uri, name, folder / name)
            verdict = str(gate.get("verdict"))
            self._log_batch(run_id, tags={TAG_VERDICT: verdict, TAG_GATE_DONE: verdict})
        self._ensure_model_version(version, run_id, artifact_uri)
        state = self.state(version)
        if done.get(TAG_COMPLETE) != state:
            self._log_batch(run_id, tags={TAG_COMPLETE: state})
        return run_id

    def _ensure_model_version(self, version: int, run_id: str, artifact_uri: str) -> str:
        known = self.model_versions()
        if version in known:
            return known[version]
        try:
            self.client.call("POST", "registered-models/create", {"name": self.model_name})
        except MlflowHttpError as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        made = self.client.call(
            "POST",
            "model-versions/create",
            {
                "name": self.model_name,
                "source": f"{artifact_uri}/model",
                "run_id": run_id,
                "tags": [
                    {"key": TAG_PIPELINE, "value": self.cfg.name},
                    {"key": TAG_VERSION, "value": str(version)},
                ],
                "description": f"trainyard {self.cfg.name} version {version}",
            },
        )
        return str(made["model_version"]["version"])

    def wanted_aliases(self) -> dict[str, int | None]:
        """What the registry says the aliases are: ``champion`` and ``challenger``.

        The challenger is the newest version newer than the champion that passed its gate
        and was never rolled back from (a rollback is a judgement against it).
        """
        champion = self.registry.champion()
        rolled_back = {
            e.get("from") for e in self.registry.history() if e.get("event") == "rollback"
        }
        challenger = None
        for version in reversed(self.registry.list_versions()):
            if champion is not None and version <= champion:
                break
            if version in rolled_back:
                continue
            gate = self.registry.read_file(version, "gate.json") or {}
            if gate.get("verdict") in PASSED:
                challenger = version
                break
        return {CHAMPION: champion, CHALLENGER: challenger}

    def sync(self, version: int | None = None) -> tuple[str | None, dict[str, int | None]]:
        """Mirror what is missing or out of date, then the aliases.

        The versions looked at: ``version``, the champion and the challenger (each
        back-filled when MLflow has no run of it), and every run of the pipeline that is
        not wholly mirrored (its ``trainyard.mirrored`` tag absent or out of date, e.g. a
        mirror that failed or was killed halfway: the run still RUNNING, a partial
        ``model/``, no gate). They are mirrored oldest first, so MLflow's model version
        numbers follow trainyard's where they can.

        Returns:
            The run id of ``version`` (None without one) and the aliases.
        """
        wanted = self.wanted_aliases()
        runs = self.pipeline_runs()
        present = set(self.registry.list_versions())
        todo = {v for v in (version, *wanted.values()) if v is not None and v not in runs}
        for v, run in runs.items():
            status = run["info"].get("status")
            if v in present and (
                status == "RUNNING" or self._tags(run).get(TAG_COMPLETE) != self.state(v)
            ):
                todo.add(v)
        run_id = None
        for v in sorted(todo):
            got = self.mirror_version(v, runs.get(v))
            if v == version:
                run_id = got
        if version is not None and run_id is None:
            run_id = runs[version]["info"]["run_id"]
        return run_id, self.sync_aliases(wanted)

    def sync_aliases(self, wanted: dict[str, int | None] | None = None) -> dict[str, int | None]:
        """Point ``champion`` / ``challenger`` where the registry says (mirroring as needed).

        Returns:
            Alias → trainyard version (None: the alias is removed).
        """
        wanted = self.wanted_aliases() if wanted is None else wanted
        known = self.model_versions()
        for version in {v for v in wanted.values() if v is not None} - set(known):
            self.mirror_version(version)  # trained before tracking was on, or while it was down
        known = self.model_versions() if set(wanted.values()) - set(known) - {None} else known
        for alias, version in wanted.items():
            if version is not None:
                self.client.call(
                    "POST",
                    "registered-models/alias",
                    {"name": self.model_name, "alias": alias, "version": known[version]},
                )
            elif known:
                try:
                    self.client.call(
                        "DELETE",
                        "registered-models/alias",
                        {"name": self.model_name, "alias": alias},
                    )
                except MlflowHttpError as e:
                    if e.status != 404:
                        raise
        return wanted


@contextlib.contextmanager
def _mirror_lock(registry: Registry, wait_s: float = _LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``_models/<pipeline>/.mirror.lock`` (``flock``): one mirror of a pipeline at a time.

    Two runs of a pipeline mirroring at once would both find no run or model version of a
    version and both create one; under the lock the second finds the first's.

    Raises:
        TrackingError: Another mirror held it for ``wait_s``.
    """
    registry.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(registry.root / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingError(
                        f"another mirror of {registry.pipeline} held "
                        f"{registry.root / _LOCK_FILE} for {wait_s:.0f}s"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def _locked_sync(m: Mirror, version: int | None) -> tuple[str | None, dict[str, int | None]]:
    with _mirror_lock(m.registry):
        return m.sync(version)


def mirror(cfg: PipelineConfig, registry: Registry, version: int | None = None) -> str | None:
    """Mirror a version (when given), what earlier mirrors missed, and the aliases.

    The steps call this after ``register``, ``evaluate``, ``deploy`` and ``models
    promote`` / ``rollback`` (:meth:`Mirror.sync`, under the pipeline's mirror lock);
    a failure is one warning and the step goes on. Nothing happens without ``tracking:``.

    Args:
        cfg: The pipeline.
        registry: Its registry (the source of truth).
        version: The version a step just made or gated.

    Returns:
        One line saying what was mirrored, or None (tracking off, or it failed: logged).
    """
    if cfg.tracking is None:
        return None
    where = f"connection {cfg.tracking.conn_id!r}"
    try:
        endpoint = tracking_uri(cfg.tracking.conn_id)
        where = f"{endpoint.url} (connection {cfg.tracking.conn_id!r})"
        m = Mirror(cfg, registry, MlflowRest(endpoint, cfg.tracking.timeout_s))
        run_id, aliases = within(
            cfg.tracking.deadline_s,
            lambda: _locked_sync(m, version),
            f"the mirror (tracking.deadline_s={cfg.tracking.deadline_s:g})",
        )
    except Exception as e:  # a mirror never fails a step: trainyard's registry already holds it
        log.warning(
            "MLflow mirror of %s%s skipped: the tracking server at %s failed: %s; "
            "the run goes on (trainyard's registry is unchanged, a later step mirrors again)",
            cfg.name,
            f" version {version}" if version is not None else "",
            where,
            e if isinstance(e, TrackingError) else f"{type(e).__name__}: {e}",
        )
        return None
    said = ", ".join(f"{a}=v{v}" if v is not None else f"{a}=none" for a, v in aliases.items())
    line = f"MLflow {where}: " + (f"run {run_id} for version {version}; " if run_id else "") + said
    log.info("%s", line)
    return line
