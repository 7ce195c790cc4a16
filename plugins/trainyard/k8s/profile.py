"""The cluster profile (``deploy/cluster_profile.yaml``): images, GPU pools, tiers, storage.

Parsed and typed once with pydantic (frozen models); errors name the file and the field.
No I/O at import: the file is read by :func:`load_cluster_profile`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from trainyard.config import (
    MAX_GPUS_PER_WORKER,
    QUANTITY_RE,
    TRAINING_POOL,
    StrictModel,
    dns_subdomain,
    error_message,
    kubernetes_quantity,
    label_key_problem,
    label_map,
    label_value_problem,
    quantity_value,
    training_pool_name,
    unknown_tier_message,
)
from trainyard.errors import ConfigError

if TYPE_CHECKING:
    from trainyard.config import TrainingConfig

DNS_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
AccessMode = Literal["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod"]


def _dns_label(value: str) -> str:
    if not DNS_LABEL_RE.match(value):
        raise ValueError(f"{value!r} is not a DNS-1035 label (lowercase, digits, '-', <= 63)")
    return value


class Taint(StrictModel):
    """A node taint of a pool; pods placed on the pool tolerate it."""

    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        problem = label_key_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: str | None) -> str | None:
        problem = None if value is None else label_value_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class GpuPool(StrictModel):
    """One GPU node pool.

    Attributes:
        name: Short pool name used by tiers (``h100``).
        generation: Larger is newer; pools are listed newest first.
        description: Human text for placement plans.
        node_labels: Labels every node of the pool carries (the pool's selector).
        taints: Taints of the pool's nodes.
        gpus_per_node: GPUs of each of its nodes, if known: no training pod may ask for
            more than the largest node of its tier has (unknown counts as
            :data:`~trainyard.config.MAX_GPUS_PER_WORKER`).
    """

    name: str
    generation: int = Field(ge=0)
    description: str = ""
    node_labels: dict[str, str] = Field(min_length=1)
    taints: tuple[Taint, ...] = ()
    gpus_per_node: int | None = Field(default=None, ge=1, le=64)

    @field_validator("name")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_label(value)

    _labels = field_validator("node_labels")(label_map)


class Tier(StrictModel):
    """A priority tier: which GPU pools, in which order, at which priority.

    ``training_slots`` is how many trainings of this tier may run at once: the slots of
    the tier's Airflow pool (:func:`training_pools`), so pipelines on different tiers
    train side by side and each tier is bounded by the GPUs its pools have.
    """

    pools: tuple[str, ...] = Field(min_length=1)
    priority_class: str
    reason: str = ""
    kueue_queue: str | None = None
    kueue_priority_class: str | None = None
    training_slots: int = Field(default=1, ge=1, le=10_000)

    @field_validator("priority_class")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_label(value)


class CpuPool(StrictModel):
    """The CPU pool for step pods, parameter servers and serving."""

    node_labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    _labels = field_validator("node_labels")(label_map)


class Resources(StrictModel):
    """Container requests and limits (Kubernetes quantities)."""

    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        for name, qty in value.items():
            if not QUANTITY_RE.match(str(qty)):
                raise ValueError(f"{name}: {qty!r} is not a Kubernetes quantity")
        return value

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for name, qty in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and quantity_value(qty) > quantity_value(limit):
                raise ValueError(
                    f"requests.{name} {qty} is above limits.{name} {limit} (the API server "
                    "refuses a pod whose request exceeds its limit)"
                )
        return self


class ResourceSet(StrictModel):
    """Resources per role."""

    steps: Resources = Resources(requests={"cpu": "500m", "memory": "1Gi"})
    trainer: Resources = Resources(requests={"cpu": "2", "memory": "8Gi"})
    ps: Resources = Resources(requests={"cpu": "1", "memory": "4Gi"})
    serving: Resources = Resources(requests={"cpu": "500m", "memory": "1Gi"})


class Images(StrictModel):
    """Container images (pinned tags; ``latest`` is refused)."""

    trainer: str
    serving: str
    steps: str
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"

    @field_validator("trainer", "serving", "steps")
    @classmethod
    def _pinned(cls, value: str) -> str:
        last = value.rsplit("/", 1)[-1]
        if "@sha256:" in value:
            return value
        if ":" not in last or last.endswith(":latest"):
            raise ValueError(f"{value!r} must be pinned to a tag or digest other than latest")
        return value


class Storage(StrictModel):
    """Persistent volumes: one PVC per dataset, one shared models PVC.

    ``volume_snapshot_class`` is the default CSI VolumeSnapshotClass for snapshots of the
    dataset PVCs (a pipeline's ``staging.volume_snapshot_class`` overrides it); when neither
    is set, no VolumeSnapshot is taken.
    """

    storage_class: str | None = None
    dataset_size: str = "10Gi"
    dataset_access_mode: AccessMode = "ReadWriteMany"
    models_pvc: str = "trainyard-models"
    models_size: str = "50Gi"
    models_access_mode: AccessMode = "ReadWriteMany"
    volume_snapshot_class: str | None = None

    @field_validator("models_pvc")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_label(value)

    _dns_subdomain = field_validator("storage_class", "volume_snapshot_class")(dns_subdomain)
    _size = field_validator("dataset_size", "models_size")(kubernetes_quantity)


class Security(StrictModel):
    """The non-root identity every trainyard container runs as."""

    run_as_user: int = Field(default=50000, ge=1)
    run_as_group: int = Field(default=0, ge=0)
    fs_group: int = Field(default=0, ge=0)


class Kueue(StrictModel):
    """Optional Kueue integration (queueing and quotas instead of raw priorities)."""

    enabled: bool = False


class ClusterProfile(StrictModel):
    """Everything that differs between clusters, in one typed object."""

    namespace: str
    service_account: str
    images: Images
    gpu_pools: tuple[GpuPool, ...] = Field(min_length=1)
    tiers: dict[str, Tier] = Field(min_length=1)
    cpu_pool: CpuPool = CpuPool()
    resources: ResourceSet = ResourceSet()
    storage: Storage = Storage()
    security: Security = Security()
    kueue: Kueue = Kueue()

    @field_validator("namespace", "service_account")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_label(value)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterProfile:
        names = [p.name for p in self.gpu_pools]
        if len(set(names)) != len(names):
            raise ValueError(f"gpu_pools: duplicate pool names in {names}")
        gens = [p.generation for p in self.gpu_pools]
        if gens != sorted(gens, reverse=True):
            raise ValueError(f"gpu_pools: list pools newest generation first (got {gens})")
        for tier_name, tier in self.tiers.items():
            unknown = [p for p in tier.pools if p not in names]
            if unknown:
                raise ValueError(f"tiers.{tier_name}.pools: unknown pool(s) {unknown}")
            if len(set(tier.pools)) != len(tier.pools):
                raise ValueError(f"tiers.{tier_name}.pools: a pool is listed twice")
            if self.kueue.enabled and not tier.kueue_queue:
                raise ValueError(f"tiers.{tier_name}.kueue_queue: required when kueue.enabled")
        return self

    def pool(self, name: str) -> GpuPool:
        """The GPU pool called ``name``.

        Raises:
            ConfigError: If there is no such pool.
        """
        for p in self.gpu_pools:
            if p.name == name:
                return p
        raise ConfigError(f"cluster profile has no GPU pool {name!r}")

    def tier(self, name: str) -> Tier:
        """The tier called ``name``.

        Raises:
            ConfigError: If there is no such tier (lists the known ones).
        """
        try:
            return self.tiers[name]
        except KeyError:
            raise ConfigError(unknown_tier_message(name, self.tiers)) from None

    def max_gpus(self, tier: str) -> int:
        """The most GPUs a training pod of ``tier`` may ask for: its largest node's count.

        Raises:
            ConfigError: If there is no such tier.
        """
        pools = [self.pool(name) for name in self.tier(tier).pools]
        return max(p.gpus_per_node or MAX_GPUS_PER_WORKER for p in pools)


def training_problems(
    profile: ClusterProfile, training: TrainingConfig, *, kueue: bool | None = None
) -> list[tuple[tuple[str, ...], str]]:
    """What in a pipeline's training config this cluster profile cannot run.

    The one list ``pipelines check`` reports and rendering refuses (the rest of the
    training config is the schema's business).

    Args:
        profile: The cluster profile.
        training: The (effective) training config.
        kueue: Kueue mode; default ``profile.kueue.enabled``.

    Returns:
        ``(field under training, message)`` per problem; empty when it renders.
    """
    if training.priority not in profile.tiers:
        return [(("priority",), unknown_tier_message(training.priority, profile.tiers))]
    problems: list[tuple[tuple[str, ...], str]] = []
    most = profile.max_gpus(training.priority)
    if training.gpus_per_worker > most:
        pools = ", ".join(profile.tier(training.priority).pools)
        problems.append(
            (
                ("gpus_per_worker",),
                f"{training.gpus_per_worker} GPUs per pod, but the largest node of tier "
                f"{training.priority!r} (pools {pools}) has {most} (the cluster profile's "
                "gpu_pools[].gpus_per_node): the pods would never schedule",
            )
        )
    use_kueue = profile.kueue.enabled if kueue is None else kueue
    if training.gpus_per_worker == 0 and use_kueue:
        problems.append(
            (
                ("gpus_per_worker",),
                "0 (CPU training) with Kueue: the tier's queue admits onto GPU flavors, so "
                "CPU pods would hold GPU nodes; ask for GPUs or train without Kueue",
            )
        )
    return problems


def training_pools(profile: ClusterProfile | None) -> dict[str, dict[str, Any]]:
    """The Airflow pools training needs, in ``airflow pools import`` format.

    Args:
        profile: The cluster profile, or None for the local runner.

    Returns:
        Pool name → ``{"slots", "description", "include_deferred"}``.
    """
    if profile is None:
        return {
            TRAINING_POOL: {
                "slots": 1,
                "description": "one distributed training at a time on this machine",
                "include_deferred": False,
            }
        }
    return {
        training_pool_name("kubernetes", name): {
            "slots": tier.training_slots,
            "description": f"trainings of tier {name} on GPU pools {', '.join(tier.pools)}",
            "include_deferred": False,
        }
        for name, tier in sorted(profile.tiers.items())
    }


def pools_main(argv: list[str]) -> int:
    """``python -m trainyard pools [--runner local|kubernetes] [--profile FILE]``.

    Prints the training pools as JSON for ``airflow pools import``.

    Args:
        argv: Arguments after ``pools``.

    Returns:
        0.
    """
    import json
    import sys

    from trainyard import argtypes
    from trainyard.settings import get_settings

    parser = argtypes.ArgumentParser(
        prog="python -m trainyard pools",
        description="The Airflow pools training needs, for `airflow pools import FILE`.",
    )
    parser.add_argument("--runner", choices=("local", "kubernetes"), default=None)
    parser.add_argument("--profile", type=Path, default=None, help="cluster profile YAML")
    args = parser.parse_args(argv)
    settings = get_settings()
    runner = args.runner or settings.runner
    profile = None
    if runner != "local":
        profile = load_cluster_profile(args.profile)
    sys.stdout.write(json.dumps(training_pools(profile), indent=2, sort_keys=True) + "\n")
    return 0


def parse_cluster_profile(raw: Any, source: str = "<cluster profile>") -> ClusterProfile:
    """Validate an already-loaded profile mapping.

    Args:
        raw: The YAML document.
        source: Where it came from, for error messages.

    Returns:
        The typed profile.

    Raises:
        ConfigError: Naming ``source`` and every failing field.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return ClusterProfile.model_validate(raw)
    except ValidationError as e:
        lines = [f"{source}: invalid cluster profile"]
        for item in e.errors():
            where = ".".join(str(p) for p in item["loc"]) or "<root>"
            lines.append(f"  {where}: {error_message(item)}")
        raise ConfigError("\n".join(lines)) from e


def load_cluster_profile(path: Path | str | None = None) -> ClusterProfile:
    """Read and validate the cluster profile.

    Args:
        path: The YAML file; defaults to ``Settings.cluster_profile``
            (``TRAINYARD_CLUSTER_PROFILE`` or ``deploy/cluster_profile.yaml``).

    Returns:
        The typed profile.

    Raises:
        ConfigError: If the file is missing, not YAML, or breaks the schema (names file and
            field).
    """
    if path is None:
        from trainyard.settings import get_settings

        path = get_settings().cluster_profile
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: cluster profile not found") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    return parse_cluster_profile(raw, str(path))
