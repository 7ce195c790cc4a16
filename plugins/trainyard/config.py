"""Pipeline configs (``dags/pipelines/<name>.yaml``), parsed and typed once, at the edge.

A pipeline names its dataset (whose contract is ``data_contracts/<dataset>.yaml``), where
the raw data comes from, and how to train, gate and serve the model. Errors name the file
and the field.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from trainyard.errors import ConfigError
from trainyard.fsutil import load_yaml
from trainyard.settings import get_settings

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def dns_subdomain(value: str | None) -> str | None:
    """``value`` unchanged if it is a Kubernetes DNS-1123 subdomain name (or None).

    Raises:
        ValueError: Naming the value and the rule (for pydantic field validators).
    """
    if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN_RE.match(value)):
        raise ValueError(
            f"{value!r} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and "
            "'.', starting and ending alphanumeric, <= 253)"
        )
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceConfig(_Strict):
    """Where the raw data of an interval is read from.

    ``url`` is an fsspec URL or a path (relative paths are relative to the project dir);
    it may contain ``{ds}`` (interval start date, ``YYYY-MM-DD``) for dated partitions.
    ``bootstrap`` names a bundled generator that writes the raw source when it is missing
    (the demo's stand-in for a data lake).
    """

    url: str
    format: Literal["csv", "parquet", "jsonl", "image_folder"]
    bootstrap: str | None = None


class StagingConfig(_Strict):
    """How snapshots are written and kept, and the dataset volume on Kubernetes.

    ``pvc_size``, ``storage_class``, ``access_mode`` and the volume snapshot options apply
    on the kubernetes runner only (the local runner's volume is a directory).
    ``volume_snapshot_class`` names a CSI VolumeSnapshotClass: after each new snapshot is
    published the dataset's PVC is snapshotted with it and the run waits up to
    ``volume_snapshot_timeout_s`` for it to be ready. Unset (the default), the cluster
    profile's ``storage.volume_snapshot_class`` applies; unset there too, nothing is
    snapshotted.
    """

    shard_target_mb: int = Field(default=128, ge=1)
    row_group_rows: int = Field(default=65536, ge=1)
    retention: int = Field(default=7, ge=1)
    pvc_size: str = "10Gi"
    storage_class: str | None = None
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"] = "ReadWriteMany"
    volume_snapshot_class: str | None = None
    volume_snapshot_timeout_s: float = Field(default=1800, gt=0)

    _dns_subdomain = field_validator("volume_snapshot_class")(dns_subdomain)


class WindowIntervals(_Strict):
    """Train on the last ``intervals`` data intervals whose snapshots passed validation."""

    intervals: int = Field(ge=1, le=100_000)


class WindowSince(_Strict):
    """Train on every validated interval snapshot whose interval starts on or after ``since``."""

    since: dt.date

    @field_serializer("since")
    def _iso(self, value: dt.date) -> str:
        return value.isoformat()


TrainingWindow = Literal["newest"] | WindowIntervals | WindowSince
"""What a model trains on: ``newest`` (the run's snapshot), ``{intervals: N}`` or
``{since: YYYY-MM-DD}`` (validated interval snapshots up to the run's interval)."""


class TrainingConfig(_Strict):
    """Distributed training parameters (defaults of the trigger form).

    ``window`` says which snapshots a run trains on (the union of them, each split into
    train and holdout by its stable key hash): ``newest`` (default) the run's own snapshot;
    ``{intervals: N}`` the last N data intervals, up to the run's, whose snapshots passed
    validation; ``{since: YYYY-MM-DD}`` every such interval starting on or after the date.
    """

    model: str
    window: TrainingWindow = "newest"
    strategy: Literal["multi_worker_mirrored", "parameter_server"] = "multi_worker_mirrored"
    workers: int = Field(default=2, ge=1, le=64)
    parameter_servers: int = Field(default=1, ge=0, le=16)
    epochs: int = Field(default=3, ge=0, le=1000)
    batch_size: int = Field(default=64, ge=1)
    learning_rate: float = Field(default=1e-3, gt=0)
    steps_per_execution: int = Field(default=8, ge=1)
    priority: str = "high"
    gpus_per_worker: int = Field(default=1, ge=0)
    start_deadline_s: float = Field(default=120, gt=0)
    attempt_timeout_s: float = Field(default=1800, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    seed: int = 0

    @field_validator("window", mode="before")
    @classmethod
    def _one_window(cls, value: Any) -> Any:
        """One error naming the three forms, instead of one per union member."""
        if value == "newest" or isinstance(value, WindowIntervals | WindowSince):
            return value
        if isinstance(value, dict) and len(value) == 1:
            ((key, item),) = value.items()
            if key == "intervals":
                if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= 100_000:
                    raise ValueError(f"intervals must be an integer from 1 to 100000, got {item!r}")
                return WindowIntervals(intervals=item)
            if key == "since":
                if isinstance(item, dt.datetime) or not isinstance(item, dt.date | str):
                    raise ValueError(f"since must be a date (YYYY-MM-DD), got {item!r}")
                try:
                    day = item if isinstance(item, dt.date) else dt.date.fromisoformat(item)
                except ValueError:
                    raise ValueError(f"since must be a date (YYYY-MM-DD), got {item!r}") from None
                return WindowSince(since=day)
        raise ValueError(
            f"must be 'newest', {{intervals: N}} or {{since: YYYY-MM-DD}}, got {value!r}"
        )


class Threshold(_Strict):
    """An absolute bound on one metric."""

    min: float | None = None
    max: float | None = None


class ChampionRule(_Strict):
    """How the candidate compares with the current champion on one metric."""

    metric: str
    higher_is_better: bool = True
    min_improvement: float = 0.0
    relative: bool = False
    max_regression: float = 0.0


class GateConfig(_Strict):
    """Declarative evaluation gate."""

    metrics: list[str] = Field(default_factory=lambda: ["accuracy", "loss"])
    thresholds: dict[str, Threshold] = Field(default_factory=dict)
    champion: ChampionRule | None = None
    slices: list[str] = Field(default_factory=list)
    fail_run_on_reject: bool = False


class ServingConfig(_Strict):
    """Where and how the promoted model is served."""

    model_name: str
    host: str = "127.0.0.1"
    port: int = Field(default=8501, ge=1, le=65535)
    smoke_rows: int = Field(default=8, ge=1)
    replicas: int = Field(default=2, ge=1)


class PipelineConfig(_Strict):
    """One pipeline: one DAG, one dataset, one model.

    ``schedule`` is a cron expression (nightly by default) or null for manual runs only;
    ``trigger_on_dataset`` also runs the pipeline when another pipeline publishes a new
    validated snapshot of the same dataset (an Airflow Asset event). In a backfill every run
    stages and validates its interval; ``backfill_training`` says which runs also train:
    only the backfill's last run (``last``), each run, or none.
    """

    name: str
    dataset: str
    description: str = ""
    owner: str = "ml-platform"
    schedule: str | None = "0 2 * * *"
    start_date: dt.date
    catchup: bool = False
    trigger_on_dataset: bool = False
    backfill_training: Literal["last", "each", "none"] = "last"
    tags: list[str] = Field(default_factory=list)
    source: SourceConfig
    staging: StagingConfig = StagingConfig()
    training: TrainingConfig
    gate: GateConfig = GateConfig()
    serving: ServingConfig

    @field_validator("name", "dataset")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"must match {NAME_RE.pattern} (lowercase, no path characters)")
        return value

    def config_hash(self) -> str:
        """Stable hash of the config, recorded in model metadata for lineage."""
        text = self.model_dump_json()
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def source_url(self, ds: str | None = None) -> str:
        """The raw source URL for an interval, relative paths resolved to the project dir.

        Args:
            ds: Interval start date (``YYYY-MM-DD``) substituted for ``{ds}``.

        Returns:
            An absolute path or an fsspec URL.
        """
        url = self.source.url.replace("{ds}", ds or "")
        if "://" in url or url.startswith("/"):
            return url
        return str(get_settings().project_dir / url)


def _format_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid pipeline config"]
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "<root>"
        lines.append(f"  {where}: {item['msg']}")
    return "\n".join(lines)


def parse_pipeline(path: Path) -> PipelineConfig:
    """Load and validate one pipeline YAML file.

    Args:
        path: The YAML file.

    Returns:
        The typed config.

    Raises:
        ConfigError: If the file is missing, not YAML, or breaks the schema (names file and
            field), or if its ``name`` differs from the file's stem.
    """
    try:
        raw: Any = load_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: pipeline config not found") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(path, e)) from e
    if cfg.name != path.stem:
        raise ConfigError(f"{path}: name {cfg.name!r} must equal the file name {path.stem!r}")
    return cfg


def pipeline_files(pipelines_dir: Path | None = None) -> list[Path]:
    """Pipeline YAML files, sorted so DAG generation is deterministic."""
    folder = pipelines_dir or get_settings().pipelines_dir
    return sorted(folder.glob("*.yaml"))


def load_pipeline(name: str) -> PipelineConfig:
    """Load a pipeline by name.

    Args:
        name: The pipeline name (file stem in the pipelines folder).

    Returns:
        The typed config.

    Raises:
        ConfigError: If no such pipeline exists (lists the known ones) or it is invalid.
    """
    if not NAME_RE.match(name):
        raise ConfigError(f"invalid pipeline name {name!r}")
    folder = get_settings().pipelines_dir
    path = folder / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in pipeline_files(folder)) or "none"
        raise ConfigError(f"unknown pipeline {name!r} (known: {known}; looked in {folder})")
    return parse_pipeline(path)
