"""Pipeline configs (``dags/pipelines/<name>.yaml``), parsed and typed once, at the edge.

A pipeline names its dataset (whose contract is ``data_contracts/<dataset>.yaml``), where
the raw data comes from, and how to train, gate and serve the model. Errors name the file
and the field.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re
import types
import typing
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from trainyard.errors import ConfigError
from trainyard.fsutil import (
    YamlWhere,
    load_yaml_indexed,
    redact_url,
    url_credentials,
)
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


QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$")
QUANTITY_SUFFIXES: dict[str, int | Decimal] = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def kubernetes_quantity(value: str) -> str:
    """``value`` unchanged if it is a Kubernetes quantity (``10Gi``, ``500m``, ``2``).

    Raises:
        ValueError: Naming the value (for pydantic field validators).
    """
    if not QUANTITY_RE.match(str(value)):
        raise ValueError(
            f"{value!r} is not a Kubernetes quantity (a number with an optional suffix: "
            "m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei; e.g. 10Gi, 500m)"
        )
    return value


def quantity_value(value: str) -> Decimal:
    """The number a quantity of :data:`QUANTITY_RE`'s form stands for (``1Ki`` → 1024)."""
    match = QUANTITY_RE.match(str(value))
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    suffix = match.group(2) or ""
    return Decimal(str(value)[: len(str(value)) - len(suffix)]) * QUANTITY_SUFFIXES[suffix]


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label (or taint) key, or None if it is one.

    A key is a qualified name: an optional DNS-1123 subdomain prefix (<= 253) and ``/``,
    then a name of 1 to 63 of ``A-Z a-z 0-9 - _ .``, starting and ending alphanumeric.
    """
    prefix, _, name = str(key).rpartition("/")
    if "/" in str(key) and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN_RE.match(prefix)):
        return f"{key!r}: its prefix {prefix!r} is not a DNS-1123 subdomain"
    if not LABEL_NAME_RE.match(name):
        return (
            f"{key!r} is not a label key (a name of 1 to 63 of A-Z a-z 0-9 - _ ., starting "
            "and ending alphanumeric, after an optional DNS subdomain and '/')"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label (or taint) value, or None if it is one."""
    if not LABEL_VALUE_RE.match(str(value)):
        return (
            f"{value!r} is not a label value (at most 63 of A-Z a-z 0-9 - _ ., starting "
            "and ending alphanumeric)"
        )
    return None


def label_map(value: dict[str, str]) -> dict[str, str]:
    """``value`` unchanged if its keys and values are Kubernetes label keys and values.

    Raises:
        ValueError: Naming the first bad key or value (for pydantic field validators).
    """
    for key, item in value.items():
        problem = label_key_problem(key) or label_value_problem(item)
        if problem:
            raise ValueError(problem)
    return value


def _numeric_only(annotation: Any) -> bool:
    """Whether a field's type takes numbers and not booleans (``int``, ``float | None``)."""
    kinds: set[Any] = set()
    todo = [annotation]
    while todo:
        t = todo.pop()
        args = typing.get_args(t)
        if typing.get_origin(t) is Annotated:
            todo.append(args[0])
        elif args and typing.get_origin(t) in (typing.Union, types.UnionType):
            todo.extend(args)
        else:
            kinds.add(t)
    return bool(kinds & {int, float}) and kinds <= {int, float, type(None)}


class StrictModel(BaseModel):
    """A frozen config model: unknown keys refused, no boolean or text taken for a number."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _only_numbers_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse ``true`` or ``"2"`` for a number: pydantic would read them as 1 and 2."""
        field = cls.model_fields.get(info.field_name or "")
        if not isinstance(value, bool | str) or field is None:
            return value
        if _numeric_only(field.annotation):
            shown = str(value).lower() if isinstance(value, bool) else f"text {value!r}"
            raise ValueError(f"expected a number, got {shown}")
        return value


class SourceConfig(StrictModel):
    """Where the raw data of an interval is read from.

    ``url`` is an fsspec URL or a path (relative paths are relative to the project dir);
    it may contain ``{ds}`` (interval start date, ``YYYY-MM-DD``) for dated partitions.
    ``bootstrap`` names a bundled generator that writes the raw source when it is missing
    (the demo's stand-in for a data lake).

    ``conn_id`` names the Airflow connection that holds the credentials of an object
    store (:func:`trainyard.connections.storage_options`); a URL never carries them.

    ``when_missing`` says what a run does when its partition (the URL for its interval)
    does not exist: ``fail`` (default) fails the stage task without retry; ``skip`` skips
    it and everything after it (the run shows skipped, not failed); ``wait`` waits for it
    before staging (a ``wait_for_source`` sensor in reschedule mode, checking every
    ``wait_poke_s`` seconds from the Airflow worker, failing after ``wait_timeout_s``).
    """

    url: str = Field(
        description="fsspec URL or path (relative: to the project); `{ds}` is replaced by the "
        "interval's start date (any other `{name}` is refused: a typo would name a file that "
        "never exists). A URL carrying credentials (`user:secret@`) is refused at its line: "
        "name an Airflow connection in `source.conn_id`; secret query parameters (`token`, "
        "`sig`, ...) are masked wherever the URL is stored or printed."
    )
    format: Literal["csv", "parquet", "jsonl", "image_folder"] = Field(
        description="The source's format, which must be the contract's `source.format`; "
        "`image_folder` is one folder per class."
    )
    conn_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,250}$")] | None = Field(
        default=None,
        description="An Airflow connection holding the store's credentials: its login and "
        "password become the file system's (`key`/`secret` for `s3`, with `endpoint_url` from "
        "its extra; `account_name`/`account_key` for `abfs`; basic auth for `http(s)`), its "
        "extra's `storage_options` pass to fsspec as they are. The local runner hands it to "
        "the stage step from Airflow's own lookup; on a cluster the step pod reads "
        "`AIRFLOW_CONN_<ID>` from its environment (a Secret), or leave it out and use "
        "workload identity. A storage library's refusal fails staging once, not retried.",
    )
    bootstrap: str | None = Field(
        default=None,
        description="A bundled generator that writes the source when it is missing (the demo's "
        "`sklearn_digits`, `synthetic_transactions`, `synthetic_churn`).",
    )
    when_missing: Literal["wait", "skip", "fail"] = Field(
        default="fail",
        description="When the interval's partition does not exist: `fail` fails `stage` without "
        "retry; `skip` skips the run's tasks with the reason (the run is not red); `wait` waits "
        "for it in a `wait_for_source` sensor before staging (reschedule mode).",
    )
    wait_timeout_s: float = Field(
        default=6 * 3600,
        gt=0,
        description="With `wait`: seconds after which the sensor fails (without retry).",
    )
    wait_poke_s: float = Field(
        default=300, gt=0, description="With `wait`: seconds between checks."
    )

    @field_validator("url")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        shown = url_credentials(value)
        if shown is not None:
            raise ValueError(
                f"{shown}: credentials in the URL are refused (they would show in logs, "
                "run pages and lineage): keep them in an Airflow connection and name it "
                "as source.conn_id (its login and password, or its extra's storage_options, "
                "reach the file system), or use the environment's or the cluster's "
                "workload identity"
            )
        unknown = sorted({p for p in PLACEHOLDER_RE.findall(value) if p != "ds"})
        if unknown:
            names = ", ".join("{" + p + "}" for p in unknown)
            raise ValueError(
                f"unknown placeholder {names}: the only one is {{ds}}, the interval's "
                "start day (YYYY-MM-DD)"
            )
        return value


PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A ``{name}`` placeholder in a source URL (only ``{ds}`` is one)."""


class StagingConfig(StrictModel):
    """How snapshots are written and kept, and the dataset volume on Kubernetes.

    ``pvc_size``, ``storage_class``, ``access_mode`` and the volume snapshot options apply
    on the kubernetes runner only (the local runner's volume is a directory).
    ``volume_snapshot_class`` names a CSI VolumeSnapshotClass: after each new snapshot is
    published the dataset's PVC is snapshotted with it and the run waits up to
    ``volume_snapshot_timeout_s`` for it to be ready. Unset (the default), the cluster
    profile's ``storage.volume_snapshot_class`` applies; unset there too, nothing is
    snapshotted.
    """

    shard_target_mb: int = Field(default=128, ge=1, description="Target shard size in MB.")
    row_group_rows: int = Field(default=65536, ge=1, description="Parquet row group size (tables).")
    retention: int = Field(
        default=7,
        ge=1,
        description="Snapshots kept per dataset besides the validated, leased and "
        "model-referenced ones.",
    )
    pvc_size: str = Field(
        default="10Gi",
        description="The dataset's PersistentVolumeClaim size (kubernetes runner), a Kubernetes "
        "quantity (`10Gi`, `500M`).",
    )
    storage_class: str | None = Field(
        default=None,
        description="Its StorageClass, a DNS-1123 subdomain name (lowercase letters, digits, `-`, "
        "`.`); default: the cluster profile's.",
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"] = Field(
        default="ReadWriteMany", description="Its access mode."
    )
    volume_snapshot_class: str | None = Field(
        default=None,
        description="A CSI VolumeSnapshotClass: the PVC is snapshotted after each new snapshot; "
        "default: the cluster profile's, else none.",
    )
    volume_snapshot_timeout_s: float = Field(
        default=1800, gt=0, description="Seconds to wait for that VolumeSnapshot to be ready."
    )

    _dns_subdomain = field_validator("storage_class", "volume_snapshot_class")(dns_subdomain)
    _quantity = field_validator("pvc_size")(kubernetes_quantity)


class WindowIntervals(StrictModel):
    """Train on the last ``intervals`` data intervals whose snapshots passed validation."""

    intervals: int = Field(
        ge=1,
        le=100_000,
        description="N of `{intervals: N}`: the last N validated data intervals up to the run's.",
    )


class WindowSince(StrictModel):
    """Train on every validated interval snapshot whose interval starts on or after ``since``."""

    since: dt.date = Field(
        description="The date of `{since: YYYY-MM-DD}`: every validated interval starting on or "
        "after it."
    )

    @field_serializer("since")
    def _iso(self, value: dt.date) -> str:
        return value.isoformat()


PARTITIONED_WINDOW = 30
"""The default window of a source partitioned by ``{ds}``: its last 30 validated intervals."""

TrainingWindow = Literal["newest"] | WindowIntervals | WindowSince
"""What a model trains on: ``newest`` (the run's snapshot), ``{intervals: N}`` or
``{since: YYYY-MM-DD}`` (validated interval snapshots up to the run's interval)."""


MAX_GPUS_PER_WORKER = 16
"""The most GPUs one training pod may ask for when the cluster profile does not say (the
largest common GPU node has 8 to 16); a pool's ``gpus_per_node`` bounds it further."""


class TrainingConfig(StrictModel):
    """Distributed training parameters (defaults of the trigger form).

    ``gpus_per_worker: 0`` trains on CPUs: the worker (and chief) pods go to the CPU pool,
    as parameter servers do, and request no GPU.

    ``window`` says which snapshots a run trains on (the union of them, each split into
    train and holdout by its stable key hash): ``newest`` (default) the run's own snapshot;
    ``{intervals: N}`` the last N data intervals, up to the run's, whose snapshots passed
    validation; ``{since: YYYY-MM-DD}`` every such interval starting on or after the date.
    """

    model: str = Field(
        description="A registered architecture "
        "(`plugins/trainyard/training/worker/architectures.py`: `small_cnn`, `mlp`)."
    )
    window: TrainingWindow = Field(
        default="newest",
        description="What the model trains on: `newest` (the run's snapshot), `{intervals: N}` "
        "(the last N validated intervals up to the run's) or `{since: YYYY-MM-DD}`. Default: "
        "`{intervals: 30}` for a source partitioned by `{ds}` (each interval brings its own "
        "rows: the newest alone would be a fraction of the data), else `newest`.",
    )
    window_gaps: Literal["fail", "train"] = Field(
        default="fail",
        description="An interval the window reaches whose snapshot is gone (another "
        "pipeline's retention, `snapshots gc`, a hand): `fail` names each and trains nothing "
        "(stage the days again to bring them back); `train` trains on what is left and says "
        "which days it lacks.",
    )
    strategy: Literal["multi_worker_mirrored", "parameter_server"] = Field(
        default="multi_worker_mirrored",
        description="`multi_worker_mirrored` (all-reduce workers) or `parameter_server` (chief, "
        "workers, parameter servers).",
    )
    workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Workers (the trigger form caps it at what this machine runs locally).",
    )
    parameter_servers: int = Field(
        default=1,
        ge=0,
        le=16,
        description="Parameter servers (`parameter_server` strategy: at least 1).",
    )
    epochs: int = Field(default=3, ge=0, le=1000, description="Epochs.")
    batch_size: int = Field(default=64, ge=1, description="Global batch size.")
    learning_rate: float = Field(default=1e-3, gt=0, description="Learning rate.")
    steps_per_execution: int = Field(default=8, ge=1, description="Steps per `tf.function` call.")
    priority: str = Field(
        default="high",
        description="The cluster profile's tier, exactly as the profile spells it (`high`, `low` "
        "in `deploy/cluster_profile.yaml`): which GPU pools, which PriorityClass, which Airflow "
        "pool. Another name is an error of `pipelines check`, `render` and the pipeline's DAG.",
    )
    gpus_per_worker: int = Field(
        default=1,
        ge=0,
        le=MAX_GPUS_PER_WORKER,
        description="GPUs requested per worker (and chief) pod, at most the `gpus_per_node` of "
        "the tier's largest GPU node in the cluster profile. 0 trains on CPUs: the pods go to the "
        "CPU pool, as parameter servers do, without GPU affinity or tolerations (refused with "
        "Kueue, whose queues admit onto GPU flavors).",
    )
    start_deadline_s: float = Field(
        default=120,
        gt=0,
        description="Seconds by which every worker must be up, or the attempt restarts.",
    )
    attempt_timeout_s: float = Field(
        default=1800, gt=0, description="One attempt's time limit in seconds."
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Attempts (each resumes from the last checkpoint)."
    )
    seed: int = Field(default=0, description="Initialisation and shuffling seed.")

    @field_validator("parameter_servers")
    @classmethod
    def _servers_for_strategy(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("strategy") == "parameter_server" and value < 1:
            raise ValueError(
                f"{value}: the parameter_server strategy needs at least 1 parameter server"
            )
        return value

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


class Threshold(StrictModel):
    """An absolute bound on one metric."""

    min: float | None = Field(default=None, description="Lower bound of that metric.")
    max: float | None = Field(default=None, description="Upper bound of that metric.")


#: Every gate metric evaluation computes, and whether a higher value is better.
HIGHER_IS_BETTER = {
    "accuracy": True,
    "auc": True,
    "loss": False,
    "rmse": False,
    "mae": False,
    "r2": True,
}
#: The metrics each task's models can be gated on, and the defaults when none are given.
TASK_METRICS = {
    "classification": ("accuracy", "loss", "auc"),
    "regression": ("rmse", "mae", "r2", "loss"),
}
DEFAULT_GATE_METRICS = {"classification": ["accuracy", "loss"], "regression": ["rmse", "mae", "r2"]}
KNOWN_METRICS = tuple(HIGHER_IS_BETTER)
"""Every metric evaluation computes."""


class ChampionRule(StrictModel):
    """How the candidate compares with the current champion on one metric.

    ``higher_is_better`` defaults to the metric's direction (:data:`HIGHER_IS_BETTER`).
    """

    metric: str = Field(description="The metric compared.")
    higher_is_better: bool = Field(
        default=True,
        description="Its direction; default: the metric's (true for `accuracy`, `auc`, `r2`; "
        "false for `loss`, `rmse`, `mae`).",
    )
    min_improvement: float = Field(
        default=0.0, description="The candidate must beat the champion by this much."
    )
    relative: bool = Field(
        default=False,
        description="The improvement and regression are fractions of the champion's value.",
    )
    max_regression: float = Field(
        default=0.0, description="Or the candidate may be worse by at most this much."
    )

    @model_validator(mode="before")
    @classmethod
    def _direction_of_metric(cls, data: Any) -> Any:
        if isinstance(data, dict) and "higher_is_better" not in data:
            metric = str(data.get("metric", "")).split("@", 1)[0]
            return {**data, "higher_is_better": HIGHER_IS_BETTER.get(metric, True)}
        return data


class ApproversConfig(StrictModel):
    """Who may answer a candidate's approval request (``gate.approval: required``).

    ``users`` are Airflow account ids; ``roles`` are roles of Airflow's simple auth manager
    (``[core] simple_auth_manager_users``), expanded to their accounts when the request is
    made. Four-eyes by default: the person who triggered a run may not approve it
    (``allow_triggerer: true`` lifts that).
    """

    users: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default=[], description="Airflow account ids who may approve."
    )
    roles: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default=[],
        description="Roles of Airflow's simple auth manager (`[core] "
        "simple_auth_manager_users`), expanded to their accounts when the request is made.",
    )
    allow_triggerer: bool = Field(
        default=False,
        description="Four-eyes when false: the person who triggered a run may not approve it.",
    )


class GateConfig(StrictModel):
    """Declarative evaluation gate."""

    metrics: list[str] | None = Field(
        default=None,
        description="Metrics evaluated on the holdout; default: the task's, `[accuracy, loss]` "
        "for a classifier, `[rmse, mae, r2]` for a regressor. A classifier's: `accuracy`, `loss` "
        "(cross-entropy), `auc`; a regressor's (`roles.task: regression` in the contract): "
        "`rmse`, `mae`, `r2`, `loss` (mean squared error).",
    )
    thresholds: dict[str, Threshold] = Field(
        default={}, description="Absolute bounds: metric → `{min, max}`."
    )
    champion: ChampionRule | None = Field(
        default=None,
        description='"No worse than the current champion" on one metric (none: thresholds only).',
    )
    slices: list[str] = Field(
        default=[], description="Columns whose values get per-slice metrics in the gate report."
    )
    fail_run_on_reject: bool = Field(
        default=False, description="A rejection fails the run instead of skipping the deploy."
    )
    approval: Literal["none", "required"] = Field(
        default="none",
        description="`required`: after the gate passes, a person approves or rejects the "
        "candidate in the Airflow UI (Required Actions: the gate report, Approve/Reject, a "
        "reason) before it ships; Reject skips the deploy; both answers are recorded in the "
        "registry (`approval.json`, `history.jsonl`), and `deploy` ships only on the answer "
        "recorded there.",
    )
    approval_timeout_h: float = Field(
        default=72.0,
        gt=0,
        description="Hours to wait for an answer; then the candidate is rejected (by `timeout`).",
    )
    approvers: ApproversConfig | None = Field(
        default=None,
        description="Who may answer (required with `approval: required`): the request's "
        "assigned users, which Airflow enforces and the task checks again.",
    )

    @model_validator(mode="after")
    def _approvers_named(self) -> GateConfig:
        if self.approval == "required" and not (
            self.approvers and (self.approvers.users or self.approvers.roles)
        ):
            raise ValueError(
                "approval: required needs approvers: name who may approve (approvers: "
                "{users: [...], roles: [...]}); anyone with a login could approve otherwise"
            )
        return self

    def for_task(self, task: str) -> GateConfig:
        """This gate with ``metrics`` set to the task's defaults when none were given."""
        if self.metrics is not None:
            return self
        return self.model_copy(update={"metrics": list(DEFAULT_GATE_METRICS[task])})


MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _serving_model_name(value: str) -> str:
    if not MODEL_NAME_RE.match(value):
        raise ValueError(
            f"{value!r}: use 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit "
            "(it names a folder of the serving root and a path of the serving API)"
        )
    return value


class ServingConfig(StrictModel):
    """Where and how the promoted model is served."""

    model_name: Annotated[str, AfterValidator(_serving_model_name)] = Field(
        json_schema_extra={"pattern": MODEL_NAME_RE.pattern},
        description="Model name in the serving API (`/v1/models/<name>`) and its folder in the "
        "serving root; 1 to 63 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit. Each "
        "pipeline needs its own, compared case-blind: a pipeline that has registered models keeps "
        "it over one that has not, else the file that sorts first does; for the other, `pipelines "
        "check` and its DAG show the error, and its deploy and `models promote/rollback` refuse "
        "before anything moves. Its Kubernetes Deployment and Service are `serving-<name>` when "
        "the name is a DNS label (lowercase, digits, `-`), else the name made one, cut and given "
        "`-<hash8>`; `pipelines check` also refuses two pipelines whose rendered names (serving, "
        "scorer, training) would still meet.",
    )
    host: str = Field(default="127.0.0.1", description="The local server's address.")
    port: int = Field(
        default=8501,
        ge=1,
        le=65535,
        description="The local server's REST port. The cluster's TF Serving Service listens on "
        "8501 whatever this says, while the deploy step and the scorer dial this port there too: "
        "keep 8501 for a cluster.",
    )
    smoke_rows: int = Field(
        default=8,
        ge=1,
        description="Holdout rows whose served predictions must equal the offline ones.",
    )
    replicas: int = Field(default=2, ge=1, description="TF Serving replicas (kubernetes runner).")


STREAM_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def _stream_name(value: str) -> str:
    if not STREAM_NAME_RE.match(value):
        raise ValueError(f"{value!r}: use 1 to 200 of A-Z a-z 0-9 . _ - (a Kafka topic name)")
    return value


StreamName = Annotated[str, AfterValidator(_stream_name)]
"""A Redis stream key or Kafka topic name."""


class StreamConfig(StrictModel):
    """The streams a pipeline's scorer reads and writes (``scoring.stream``).

    ``engine`` is ``redis`` (Redis Streams; the project's own server unless ``url`` or
    ``TRAINYARD_REDIS_URL`` names another) or ``kafka`` (``bootstrap_servers``; on a
    cluster the scorer Deployment runs ``partitions`` replicas, one per partition of
    ``input``). ``group`` is the consumer group (default ``trainyard-<pipeline>``).
    """

    engine: Literal["redis", "kafka"] = Field(
        default="redis",
        description="`redis` (Redis Streams; the project's own server in `.trainyard/redis`) or "
        "`kafka`.",
    )
    input: StreamName = Field(
        description="The input stream (Redis key or Kafka topic): one JSON record per entry, "
        "checked against the dataset's contract."
    )
    output: StreamName = Field(
        description="The output stream: `{id, score, class_id, version, source}` per record, "
        "keyed by record id. One pipeline's own (compared exactly, with the engine and server): a "
        "second pipeline writing to it is refused."
    )
    dead_letter: StreamName = Field(
        description="The dead-letter stream: every record that fails the contract, with the "
        "reason. One pipeline's own, as `output`."
    )
    group: StreamName | None = Field(
        default=None, description="The consumer group; default: `trainyard-<pipeline>`."
    )
    url: str | None = Field(
        default=None,
        description="A Redis URL (`redis://host:6379/0`, `unix:///path.sock`); default: the "
        "project's server, or `TRAINYARD_REDIS_URL`. Required on a cluster, where no pod reaches "
        "this machine's server (`pipelines check --profile` refuses a Redis stream without it).",
    )
    bootstrap_servers: str | None = Field(
        default=None, description="Kafka brokers, `host:port[,host:port]` (required for `kafka`)."
    )
    partitions: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Partitions of the Kafka input topic: the scorer Deployment's replicas.",
    )

    @model_validator(mode="after")
    def _engine_fields(self) -> StreamConfig:
        if self.engine == "kafka" and not self.bootstrap_servers:
            raise ValueError("engine kafka needs bootstrap_servers (host:port[,host:port])")
        if self.engine == "redis" and self.bootstrap_servers:
            raise ValueError("bootstrap_servers is for engine kafka; redis takes url")
        if len({self.input, self.output, self.dead_letter}) != 3:
            raise ValueError("input, output and dead_letter must be three different streams")
        return self


class ScoringConfig(StrictModel):
    """Stream scoring with the served champion (``python -m trainyard score-stream``).

    Without ``stream`` nothing is scored. The scorer reads micro-batches of up to
    ``batch_size`` records (waiting at most ``max_wait_ms`` for the first), keeps at most
    ``max_in_flight`` batches at the model server, and claims records a dead scorer left
    unacknowledged for ``claim_idle_s``, one at a time; one delivered more than
    ``max_deliveries`` times without a commit (each scorer that took it crashed, was
    killed or hung) is dead-lettered instead. At least 2: the first delivery is in a
    batch, which another record may have stopped; a claimed one is tried alone.
    """

    stream: StreamConfig | None = Field(
        default=None,
        description="The streams the scorer reads and writes (none: nothing is scored).",
    )
    batch_size: int = Field(
        default=256, ge=1, le=65536, description="Records per micro-batch (one `:predict` call)."
    )
    max_wait_ms: int = Field(
        default=20, ge=1, le=60_000, description="How long a read waits for records (milliseconds)."
    )
    max_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Micro-batches at the model server at once; beyond that the scorer stops "
        "reading (back-pressure).",
    )
    claim_idle_s: float = Field(
        default=60,
        gt=0,
        le=86_400,
        allow_inf_nan=False,
        description="Records another scorer read but left unacknowledged this long (seconds) are "
        "claimed (a killed scorer's), one at a time. Shorter than a batch's time at the model "
        "server (`request_timeout_s` and its retries), two scorers on one group claim each "
        "other's batches and score them twice.",
    )
    max_deliveries: int = Field(
        default=2,
        ge=2,
        le=1000,
        description="A claimed record delivered more times than this without a commit (every "
        "scorer that took it crashed, was killed or hung) is dead-lettered unread. At least 2: "
        "its first delivery is in a batch another record may have stopped; a claimed one is tried "
        "alone.",
    )
    request_timeout_s: float = Field(
        default=30,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="One `:predict` call's time limit in seconds (then retried with back-off).",
    )


class TriggerStreamConfig(StrictModel):
    """A stream whose messages say new data arrived (``trigger.stream``): each starts a run.

    ``engine: redis`` reads a Redis stream ``name`` with the consumer group ``group``
    (default ``trainyard-trigger-<pipeline>``) on the project's own server unless ``url``
    (``redis://``, ``rediss://``, ``unix://``) or ``TRAINYARD_REDIS_URL`` names another;
    ``engine: kafka`` reads the topic ``name`` through the Airflow connection
    ``kafka_config_id`` (default ``kafka_default``; common-messaging's
    ``MessageQueueTrigger``). A message holds ``ds`` (the day to stage) or
    ``interval_start`` and ``interval_end``, or nothing (the day the run runs).
    A Redis message is acknowledged by the run that takes it; one handed to Airflow that
    no run took within ``redeliver_after_s`` (an event for a paused DAG starts no run) is
    handed over again.
    """

    engine: Literal["redis", "kafka"] = Field(
        default="redis",
        description="`redis` (a Redis stream read with a consumer group; the project's own "
        "server) or `kafka` (common-messaging's `MessageQueueTrigger`).",
    )
    name: StreamName = Field(description="The Redis stream key or Kafka topic.")
    group: StreamName | None = Field(
        default=None,
        description="The Redis consumer group; default: `trainyard-trigger-<pipeline>`.",
    )
    url: str | None = Field(
        default=None,
        description="A Redis URL (`redis://`, `rediss://`, `unix://`; `redis` only); default: the "
        "project's server, or `TRAINYARD_REDIS_URL`.",
    )
    kafka_config_id: str | None = Field(
        default=None,
        min_length=1,
        description="The Airflow connection of the Kafka brokers (`kafka` only); default: "
        "`kafka_default`.",
    )
    poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="How long one read waits for a message (seconds).",
    )
    redeliver_after_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        allow_inf_nan=False,
        description="A message no run took (acknowledged) this many seconds after it was "
        "announced is announced again, e.g. one taken while the DAG was paused (`redis` only).",
    )

    @model_validator(mode="after")
    def _engine_fields(self) -> TriggerStreamConfig:
        if self.engine == "kafka" and (self.url or self.group):
            raise ValueError("url and group are for engine redis; kafka takes kafka_config_id")
        if self.engine == "kafka" and "redeliver_after_s" in self.model_fields_set:
            raise ValueError("redeliver_after_s is for engine redis")
        if self.engine == "redis" and self.kafka_config_id:
            raise ValueError("kafka_config_id is for engine kafka; redis takes url")
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"url {redact_url(self.url)!r} is not a Redis URL (redis://, rediss://, unix://)"
            )
        return self


class TriggerConfig(StrictModel):
    """What starts a run besides the schedule: ``stream`` (an Airflow ``AssetWatcher``)."""

    stream: TriggerStreamConfig | None = Field(
        default=None,
        description='A stream whose "new data" messages each start a run (an Airflow '
        "`AssetWatcher`). A message holds `ds` (a day: `[ds, ds + 1 day)`) or `interval_start` "
        "and `interval_end` (days, the end excluded), or nothing (the day the run runs); days are "
        "`YYYY-MM-DD`, not after today nor before `start_date`.",
    )


EMAIL_RE = re.compile(r"^[^@\s<>]+@[^@\s<>]+$")
NotifyEvent = Literal["failure", "rejection", "promotion"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("failure", "rejection", "promotion")


class NotifyConfig(StrictModel):
    """E-mail a pipeline's outcomes (``notify:``) through an Airflow SMTP connection.

    ``events`` picks what is mailed: a task that fails for good (after its retries), a
    rejection (by the gate, or by a person asked for approval), a promotion (the deploy
    served the new champion). (Not ``on``: YAML reads a bare ``on`` key as ``true``.)
    """

    email: list[str] = Field(
        min_length=1,
        description="Recipients of the pipeline's outcome mails (at least one address).",
    )
    events: list[NotifyEvent] = Field(
        default=list(NOTIFY_EVENTS),
        min_length=1,
        description="Which outcomes are mailed: a task failed for good (after its retries; the "
        "task, the error), a rejection by the gate or by a person asked for approval (the reason "
        "and the gate report, candidate and champion side by side), a promotion (the served "
        "version, its URL, metrics and approver). Mails are sent by Airflow's tasks only, not by "
        "`python -m trainyard run`.",
    )
    smtp_conn_id: str = Field(
        default="smtp_default",
        description="The Airflow SMTP connection the mails go through (host, port, login, TLS; "
        "looked up when a mail is sent). Its extras `timeout` and `retry_limit` bound how long a "
        "mail server that does not answer can hold a task (Airflow's defaults: 30 s, 5 retries); "
        "a local test server needs `disable_tls` and `disable_ssl`.",
    )
    from_email: str = Field(default="trainyard@localhost", description="The sender address.")

    @model_validator(mode="before")
    @classmethod
    def _bare_on(cls, data: Any) -> Any:
        if isinstance(data, dict) and True in data:
            raise ValueError(
                "a key YAML read as true: a bare `on:` is a boolean in YAML; the list of "
                "outcomes is `events:`"
            )
        return data

    @field_validator("email")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        bad = [a for a in value if not EMAIL_RE.match(a)]
        if bad:
            raise ValueError(f"not an e-mail address: {', '.join(map(repr, bad))}")
        return value

    @field_validator("from_email")
    @classmethod
    def _sender(cls, value: str) -> str:
        if not EMAIL_RE.match(value):
            raise ValueError(f"not an e-mail address: {value!r}")
        return value


class TrackingConfig(StrictModel):
    """Mirror each training into an experiment tracker (``tracking:``); off without it.

    trainyard's registry stays the source of truth: the tracker gets a copy (a run per
    trained version with its parameters, per-epoch metrics, evaluation metrics, gate report
    and model files; a registered model version per trainyard version; the ``champion`` and
    ``challenger`` aliases) and a tracker that cannot be reached costs one warning, never a
    run. The tracker's URL is the Airflow connection ``conn_id`` (:mod:`trainyard.tracking`).
    """

    backend: Literal["mlflow"] = Field(
        description="`mlflow` (the only one): MLflow's REST API, server 2.x or 3.x with its "
        "artifact proxy (`--serve-artifacts`, the default)."
    )
    conn_id: str = Field(
        min_length=1,
        max_length=250,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The Airflow connection of the tracking server, an `http` or `https` "
        "connection (host, port, a path prefix as schema, login/password for basic auth). Steps "
        "read it as `AIRFLOW_CONN_<CONN_ID>` (the local runner sets that for each step from "
        "Airflow's own lookup, so a connection in Airflow's database works; outside Airflow, and "
        "in pods, set it yourself), else `MLFLOW_TRACKING_URI`.",
    )
    experiment: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="The MLflow experiment the runs go to (made on first use); default: "
        "`trainyard/<name>`.",
    )
    # MLflow refuses '/' and ':' in a registered model's name, and a name that is blank, '.'
    # or starts with '..'; quotes and backslashes would break the search filters the mirror
    # builds from the name. Checked by _model_name (one clear message); the pattern is for
    # the JSON schema.
    registered_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        json_schema_extra={"pattern": r"^(?!\.\.)(?!\.$)(?!\s*$)[^/:'\"`\\]+$"},
        description="The MLflow registered model whose versions mirror trainyard's; default: the "
        "pipeline's `name`. At most 256 characters; no `/` or `:`, which MLflow refuses, not "
        "blank, `.` or starting with `..`; no quotes or backslashes.",
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="How long one request to the tracker may take (seconds).",
    )
    deadline_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="How long a step's whole mirror may take (seconds): a tracker that "
        "answers slowly, a byte at a time or not at all is left behind with a warning, and "
        "the step goes on (the next step mirrors what was missed).",
    )

    @field_validator("registered_model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        bad = sorted({c for c in value if c in "/:'\"`\\"})
        if bad or not value.strip() or value == "." or value.startswith(".."):
            why = (
                "contains " + " ".join(repr(c) for c in bad)
                if bad
                else "is blank, '.' or starts with '..'"
            )
            raise ValueError(
                f"{value!r} {why}: MLflow refuses a registered model name with '/' or ':' "
                "(or one that is blank, '.' or starts with '..'), and trainyard one with "
                "quotes or backslashes; pick another name (default: the pipeline's name)"
            )
        return value


class PipelineConfig(StrictModel):
    """One pipeline: one DAG, one dataset, one model.

    ``schedule`` is a cron expression (nightly by default) or null for manual runs only;
    ``trigger_on_dataset`` also runs the pipeline when another pipeline publishes a new
    validated snapshot of the same dataset (an Airflow Asset event). In a backfill every run
    stages and validates its interval; ``backfill_training`` says which runs also train:
    only the backfill's last run (``last``), each run, or none.
    """

    name: str = Field(
        description="Pipeline name, equal to the file name: a lowercase letter, then lowercase "
        "letters, digits and `_` (at most 63). The DAG is `trainyard_<name>`, the registry "
        "`_models/<name>/`."
    )
    dataset: str = Field(
        description="Dataset name (as `name`): its volume `<volume root>/<dataset>/` and its "
        "contract `data_contracts/<dataset>.yaml`."
    )
    description: str = Field(default="", description="Shown as the DAG's description.")
    owner: str = Field(default="ml-platform", description="Airflow task owner.")
    schedule: str | None = Field(
        default="0 2 * * *",
        description="Cron expression of the data intervals (checked: `0 25 * * *` is refused; "
        "`@daily`, `@hourly` ... are cron), or null for manual runs only.",
    )
    start_date: dt.date = Field(
        description="The first data interval (`YYYY-MM-DD`; a date that is no calendar day, "
        "`2026-11-31`, is refused)."
    )
    catchup: bool = Field(
        default=False, description="Run every missed interval since `start_date` when unpaused."
    )
    trigger_on_dataset: bool = Field(
        default=False,
        description="Also run when another pipeline publishes a new validated snapshot of the "
        "same dataset (an Airflow Asset event).",
    )
    backfill_training: Literal["last", "each", "none"] = Field(
        default="last",
        description="In a backfill, which runs train: the backfill's `last` run, `each` run, or "
        "`none`.",
    )
    tags: list[str] = Field(default=[], description="DAG tags.")
    source: SourceConfig = Field(description="Where an interval's raw data is read from.")
    staging: StagingConfig = Field(
        default=StagingConfig(), description="How snapshots are written and kept."
    )
    training: TrainingConfig = Field(
        description="Distributed training; each field is also the trigger form's default."
    )
    gate: GateConfig = Field(default=GateConfig(), description="Whether a candidate may ship.")
    serving: ServingConfig = Field(description="Where the champion is served.")
    scoring: ScoringConfig = Field(
        default=ScoringConfig(),
        description="Stream scoring with the served champion (`python -m trainyard score-stream`; "
        "the deploy step starts or restarts it).",
    )
    trigger: TriggerConfig = Field(
        default=TriggerConfig(), description="What starts a run besides the schedule."
    )
    notify: NotifyConfig | None = Field(
        default=None, description="E-mail the pipeline's outcomes (none without it)."
    )
    tracking: TrackingConfig | None = Field(
        default=None,
        description="Mirror each training into an experiment tracker (off without it). "
        "trainyard's registry stays the source of truth; a tracker that cannot be reached costs "
        "one warning, never a run.",
    )

    @model_validator(mode="before")
    @classmethod
    def _window_of_a_partitioned_source(cls, data: Any) -> Any:
        """A source partitioned by ``{ds}`` trains on its last intervals unless told.

        Found by a new user: a backfilled dataset trained on its newest day only (95 of
        569 rows), silently.
        """
        if not isinstance(data, dict):
            return data
        source, training = data.get("source"), data.get("training")
        if (
            isinstance(source, dict)
            and "{ds}" in str(source.get("url", ""))
            and isinstance(training, dict)
            and "window" not in training
        ):
            window = {"intervals": PARTITIONED_WINDOW}
            return {**data, "training": {**training, "window": window}}
        return data

    @field_validator("name", "dataset")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"must match {NAME_RE.pattern} (lowercase, no path characters)")
        return value

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None and not _is_cron(value):
            raise ValueError(
                f"{value!r} is not a cron expression (minute hour day month weekday, e.g. "
                "'0 2 * * *', or @daily, @hourly ...), or null for manual runs only"
            )
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


@functools.lru_cache(maxsize=256)
def _is_cron(value: str) -> bool:
    """Whether croniter accepts ``value`` (asked once per expression: pipelines share them)."""
    from croniter import croniter

    return bool(croniter.is_valid(value))


def _fields_at(loc: tuple[Any, ...]) -> list[str] | None:
    """The fields the model at a location (a key path of the YAML) accepts, if it is one."""
    model: Any = PipelineConfig
    for key in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(key))
        if field is None:
            return None
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(model.model_fields)
    return None


def error_message(item: Any) -> str:
    """One pydantic error's message, without pydantic's "Value error, " before our own."""
    return str(item["msg"]).removeprefix("Value error, ")


def _schema_problems(err: ValidationError, where: YamlWhere) -> list[str]:
    lines = []
    for item in err.errors():
        loc = tuple(k for k in item["loc"] if isinstance(k, int) or "[" not in str(k))
        message = error_message(item)
        if item["type"] == "extra_forbidden":
            known = _fields_at(loc[:-1])
            message = "unknown field" + (f" (known: {', '.join(known)})" if known else "")
        lines.append(where(loc, message))
    return lines


MAX_PIPELINE_BYTES = 256 * 1024
"""Largest pipeline config read: every DAG parse reads every one (the shipped are ~1 KiB)."""

MAX_PIPELINE_NODES = 10_000
"""Most YAML nodes a pipeline config may expand to (the shipped have ~100)."""


class InvalidPipelineConfig(ConfigError):
    """A pipeline config with problems, each ``file:line: field: message``."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.problems = problems
        listed = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{path}: invalid pipeline config\n{listed}")


def parse_pipeline(path: Path) -> PipelineConfig:
    """Load and validate one pipeline YAML file.

    Args:
        path: The YAML file.

    Returns:
        The typed config.

    Raises:
        ConfigError: If the file is missing, not YAML, has a key twice or breaks the schema
            (each problem as ``file:line: field: message``), or if its ``name`` differs from
            the file's stem.
    """
    try:
        with path.open("rb") as f:
            data = f.read(MAX_PIPELINE_BYTES + 1)
        if len(data) > MAX_PIPELINE_BYTES:
            raise ConfigError(
                f"{path}: refused: a pipeline config is at most {MAX_PIPELINE_BYTES // 1024} KiB "
                "(every DAG parse reads it)"
            )
        text = data.decode("utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: pipeline config not found") from e
    except (OSError, UnicodeError) as e:
        raise ConfigError(f"{path}: cannot read the pipeline config: {e}") from e
    try:
        raw, lines, duplicates = load_yaml_indexed(text, path, MAX_PIPELINE_NODES)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{at}: not valid YAML: {getattr(e, 'problem', None) or e}") from e
    where = YamlWhere(path, lines)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    # every problem of the file at once: keys given twice, then the schema's
    problems = [where(d, "key given twice") for d in duplicates]
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise InvalidPipelineConfig(path, problems + _schema_problems(e, where)) from e
    if cfg.name != path.stem:
        problems.append(where(("name",), f"{cfg.name!r} must equal the file name {path.stem!r}"))
    if problems:
        raise InvalidPipelineConfig(path, problems)
    return cfg


def pipeline_json_schema() -> str:
    """The pipeline config's JSON schema (``dags/pipelines/pipeline.schema.json``)."""
    import json

    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://trainyard.dev/schemas/pipeline.schema.json",
        **PipelineConfig.model_json_schema(),
    }
    return json.dumps(schema, indent=2)  # properties in the models' order, as documented


def pipeline_files(pipelines_dir: Path | None = None) -> list[Path]:
    """Pipeline YAML files, sorted so DAG generation is deterministic."""
    folder = pipelines_dir or get_settings().pipelines_dir
    return sorted(folder.glob("*.yaml"))


def pipeline_path(name: str) -> Path:
    """The YAML file of a pipeline, by name.

    Raises:
        ConfigError: If the name is invalid or no such pipeline exists (lists the known ones).
    """
    if not NAME_RE.match(name):
        raise ConfigError(f"invalid pipeline name {name!r}")
    folder = get_settings().pipelines_dir
    path = folder / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in pipeline_files(folder)) or "none"
        raise ConfigError(f"unknown pipeline {name!r} (known: {known}; looked in {folder})")
    return path


def load_pipeline(name: str) -> PipelineConfig:
    """Load a pipeline by name (the names it refers to: :func:`trainyard.pipelines.check`).

    Args:
        name: The pipeline name (file stem in the pipelines folder).

    Returns:
        The typed config.

    Raises:
        ConfigError: If no such pipeline exists (lists the known ones) or it is invalid.
    """
    return parse_pipeline(pipeline_path(name))


TRAINING_POOL = "trainyard_training"
"""The Airflow pool of training tasks on the local runner (one slot on a laptop)."""


def unknown_tier_message(tier: str, known: Any) -> str:
    """The error for a ``training.priority`` the cluster profile has no tier of."""
    return f"unknown priority tier {tier!r} (known: {', '.join(sorted(known))})"


def training_pool_name(runner: str, tier: str) -> str:
    """The Airflow pool a training task of ``tier`` waits in on ``runner``.

    Locally every training shares one pool (one machine); on a cluster each tier has its
    own, sized by the profile (:func:`training_pools`).
    """
    return TRAINING_POOL if runner == "local" else f"{TRAINING_POOL}_{tier}"
