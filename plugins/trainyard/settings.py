"""Where things live and how this deployment runs, read once from the environment.

Every ``TRAINYARD_*`` setting is read here (the architecture test holds every other module
to it). The difference between the embedded default (a laptop) and a Kubernetes cluster
is one setting, ``TRAINYARD_RUNNER``; where a model is served is resolved once from it
(:func:`serving_endpoint`). The only other variables read elsewhere are the pod's
environment contract, which the launcher sets for the worker it starts
(:mod:`trainyard.training.spec`: ``TRAINYARD_TF_*``, the attempt, the parent's pid, the
fault injection of tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trainyard.layout import CHECKPOINTS_DIR, Layout

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig

Runner = Literal["local", "kubernetes"]

_PACKAGE_DIR = Path(__file__).resolve().parent
_DEFAULT_PROJECT_DIR = _PACKAGE_DIR.parents[1]


@dataclass(frozen=True)
class Settings:
    """Resolved locations and the runner.

    Attributes:
        project_dir: Checkout root (holds ``dags/``, ``data_contracts/``).
        volume_root: Root of the dataset volumes and the models volume.
        runner: ``local`` runs steps as local processes; ``kubernetes`` renders pods.
        pipelines_dir: Folder of pipeline YAML files.
        contracts_dir: Folder of data contract YAML files.
        cluster_profile: Cluster profile YAML (GPU pools, tiers, images).
        redis_dir: The embedded default's Redis server (stream scoring): its data, socket,
            pid and log files (``TRAINYARD_REDIS_DIR``, default ``.trainyard/redis``).
        redis_url: A Redis server to use instead of that one (``TRAINYARD_REDIS_URL``,
            e.g. ``redis://host:6379/0`` or ``unix:///path/redis.sock``), or None.
        redis_server: The ``redis-server`` program (``TRAINYARD_REDIS_SERVER``).
        serving_host: The cluster's serving Service (``TRAINYARD_SERVING_HOST``, set by the
            kubernetes runner and compose for the pods that reach it), or None locally.
        image: The image a step runs in (``TRAINYARD_IMAGE``, recorded with each model).
        failure_notifier: ``module:attribute`` of an Airflow notifier for failed runs
            (``TRAINYARD_FAILURE_NOTIFIER``), or None.
        postgres_dir: The embedded PostgreSQL cluster (``TRAINYARD_POSTGRES_DIR``).
        pg_bin: A PostgreSQL bin folder instead of the pinned wheel's (``TRAINYARD_PG_BIN``).
        progress_s: ``TRAINYARD_PROGRESS_S`` as given (seconds between progress lines, or
            ``off``; :func:`trainyard.progress.progress_interval` checks it).
        verbose: Keep TensorFlow's start-up noise in logs (``TRAINYARD_VERBOSE``).
        allreduce_pack_bytes: Gradients packed per all-reduce (``TRAINYARD_ALLREDUCE_PACK_BYTES``).
        xcom_path: Where a step pod writes its result (``TRAINYARD_XCOM_PATH``), or None.
        termination_log: Where a step pod writes its one-line error
            (``TRAINYARD_TERMINATION_LOG``), or None.
        stop_file: A file ``make run`` creates on Ctrl-C (``TRAINYARD_STOP_FILE``): once
            it exists the local runner starts no step and a step that ends fails for good.
    """

    project_dir: Path
    volume_root: Path
    runner: Runner
    pipelines_dir: Path
    contracts_dir: Path
    cluster_profile: Path
    redis_dir: Path = _DEFAULT_PROJECT_DIR / ".trainyard" / "redis"
    redis_url: str | None = None
    redis_server: str = "redis-server"
    serving_host: str | None = None
    image: str = "local"
    failure_notifier: str | None = None
    postgres_dir: Path = _DEFAULT_PROJECT_DIR / ".trainyard" / "postgres"
    pg_bin: Path | None = None
    progress_s: str = ""
    verbose: bool = False
    allreduce_pack_bytes: int = 0
    xcom_path: Path | None = None
    termination_log: Path | None = None
    stop_file: Path | None = None

    @property
    def models_root(self) -> Path:
        """Root of the models volume (registry of every pipeline)."""
        return Layout(self.volume_root).models_root

    @property
    def serving_root(self) -> Path:
        """TF Serving model base paths live below this folder, one per model name."""
        return Layout(self.volume_root).serving_root

    @property
    def checkpoints_root(self) -> Path:
        """Training checkpoints (BackupAndRestore) of every run."""
        return self.volume_root / CHECKPOINTS_DIR

    @property
    def raw_root(self) -> Path:
        """Raw sources bundled with the project are exported here (the demo's 'lake')."""
        return self.project_dir / ".trainyard" / "raw"


def get_settings() -> Settings:
    """Read the settings from the environment (cheap: no I/O).

    Returns:
        The resolved settings.

    Raises:
        ValueError: If ``TRAINYARD_RUNNER`` is not ``local`` or ``kubernetes``.
    """
    project = Path(os.environ.get("TRAINYARD_PROJECT_DIR", _DEFAULT_PROJECT_DIR)).resolve()
    runner = os.environ.get("TRAINYARD_RUNNER", "local")
    if runner not in ("local", "kubernetes"):
        raise ValueError(f"TRAINYARD_RUNNER must be 'local' or 'kubernetes', got {runner!r}")
    return Settings(
        project_dir=project,
        volume_root=Path(
            os.environ.get("TRAINYARD_VOLUME_ROOT", project / ".trainyard" / "volumes")
        ).resolve(),
        runner=runner,  # type: ignore[arg-type]
        pipelines_dir=Path(
            os.environ.get("TRAINYARD_PIPELINES_DIR", project / "dags" / "pipelines")
        ),
        contracts_dir=Path(os.environ.get("TRAINYARD_CONTRACTS_DIR", project / "data_contracts")),
        cluster_profile=Path(
            os.environ.get("TRAINYARD_CLUSTER_PROFILE", project / "deploy" / "cluster_profile.yaml")
        ),
        redis_dir=Path(os.environ.get("TRAINYARD_REDIS_DIR", project / ".trainyard" / "redis")),
        redis_url=os.environ.get("TRAINYARD_REDIS_URL") or None,
        redis_server=os.environ.get("TRAINYARD_REDIS_SERVER") or "redis-server",
        serving_host=os.environ.get("TRAINYARD_SERVING_HOST") or None,
        image=os.environ.get("TRAINYARD_IMAGE") or "local",
        failure_notifier=os.environ.get("TRAINYARD_FAILURE_NOTIFIER") or None,
        postgres_dir=Path(
            os.environ.get("TRAINYARD_POSTGRES_DIR") or project / ".trainyard" / "postgres"
        ).absolute(),
        pg_bin=_path(os.environ.get("TRAINYARD_PG_BIN")),
        progress_s=os.environ.get("TRAINYARD_PROGRESS_S", "").strip(),
        verbose=os.environ.get("TRAINYARD_VERBOSE", "").strip().lower() in ("1", "true", "yes"),
        allreduce_pack_bytes=int(os.environ.get("TRAINYARD_ALLREDUCE_PACK_BYTES") or 0),
        xcom_path=_path(os.environ.get("TRAINYARD_XCOM_PATH")),
        termination_log=_path(os.environ.get("TRAINYARD_TERMINATION_LOG")),
        stop_file=_path(os.environ.get("TRAINYARD_STOP_FILE")),
    )


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


SERVING_REST_PORT = 8501
"""TF Serving's REST port: the serving Deployment's container and Service listen on it."""
SERVING_GRPC_PORT = 8500
"""TF Serving's gRPC port."""


@dataclass(frozen=True)
class ServingEndpoint:
    """Where a pipeline's model is served, resolved once for this runner.

    Attributes:
        host: Host name or address.
        port: REST port.
        local: True when the server runs on this machine and trainyard starts it (the
            embedded default); False for the cluster's or compose's TF Serving.
    """

    host: str
    port: int
    local: bool

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"


def serving_endpoint(cfg: PipelineConfig, settings: Settings | None = None) -> ServingEndpoint:
    """Where deploy, the smoke test, the scorer, the UI and the summary reach the model.

    On a laptop the pipeline's ``serving.host`` and ``serving.port`` (the local server
    binds them); wherever ``TRAINYARD_SERVING_HOST`` names a TF Serving Service (the
    kubernetes runner's pods, compose), that host on TF Serving's own REST port, whatever
    the YAML's port says: the YAML's port is a laptop's choice.

    Args:
        cfg: The pipeline.
        settings: The settings (default: the environment's).

    Returns:
        The endpoint.
    """
    settings = settings or get_settings()
    if settings.serving_host:
        return ServingEndpoint(settings.serving_host, SERVING_REST_PORT, local=False)
    return ServingEndpoint(cfg.serving.host, cfg.serving.port, local=True)
