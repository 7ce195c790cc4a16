"""Where things live, chosen once from the environment.

Every difference between the embedded default (a laptop) and a Kubernetes cluster is
decided here by one setting, ``TRAINYARD_RUNNER``; nothing else in trainyard branches on
the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainyard.layout import CHECKPOINTS_DIR, Layout

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
    """

    project_dir: Path
    volume_root: Path
    runner: Runner
    pipelines_dir: Path
    contracts_dir: Path
    cluster_profile: Path
    redis_dir: Path = _DEFAULT_PROJECT_DIR / ".trainyard" / "redis"
    redis_url: str | None = None

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
    )
