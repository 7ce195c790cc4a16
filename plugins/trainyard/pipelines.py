"""Checks of a pipeline that reach past its own file: the names it refers to, and its peers.

:func:`parse_pipeline <trainyard.config.parse_pipeline>` validates one YAML file against
its schema; here it is checked against everything else it names (the model, the dataset's
contract, the gate's metrics, the cluster profile) and against the other pipelines (the
names no two may share, the Kubernetes objects whose names would meet). ``pipelines check``
and ``stage`` run :func:`check_pipeline`; every step that publishes under a shared name
runs :func:`ensure_own_names`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainyard.config import (
    HIGHER_IS_BETTER,
    KNOWN_METRICS,
    NAME_RE,
    TASK_METRICS,
    InvalidPipelineConfig,
    PipelineConfig,
    TrainingConfig,
    parse_pipeline,
    pipeline_files,
    pipeline_path,
)
from trainyard.errors import ConfigError
from trainyard.fsutil import YamlWhere, load_yaml, yaml_line_index
from trainyard.settings import get_settings


def check(name: str) -> PipelineConfig:
    """Load a pipeline by name and check the names it refers to (:func:`check_pipeline`)."""
    return check_pipeline(pipeline_path(name))


def check_pipeline(path: Path, profile: Any = None, cluster: bool = False) -> PipelineConfig:
    """Parse a pipeline and check what the schema cannot: names it refers to must exist.

    The training model must be registered, the dataset must have a data contract whose
    source format is the pipeline's, gate metrics must be ones evaluation computes, and
    the cluster profile must be able to run its training (its ``priority`` a tier, its
    GPUs on a node of that tier: :func:`trainyard.k8s.profile.training_problems`, what
    ``render`` refuses). Run by ``python -m trainyard pipelines check`` and before
    ``stage`` reads anything.

    Args:
        path: The pipeline file.
        profile: The ``ClusterProfile``; default the settings' (``TRAINYARD_CLUSTER_PROFILE``).
        cluster: Check for a cluster: also refuse what runs only on this machine (a Redis
            stream without a ``url``: :func:`trainyard.k8s.scoring.cluster_stream_problem`).

    Raises:
        ConfigError: Every problem as ``file:line: field: message`` (or the profile's own
            error, if it does not load).
    """
    from trainyard.contracts import load_contract
    from trainyard.errors import ContractError
    from trainyard.training.worker.architectures import MODEL_INPUTS, MODELS

    problems: list[str] = []
    cfg: PipelineConfig | None = None
    try:
        cfg = parse_pipeline(path)
    except InvalidPipelineConfig as e:  # go on: the names the file refers to are checked too
        problems = list(e.problems)
    text = path.read_text(encoding="utf-8")
    raw: dict[str, Any] = load_yaml(text, path)
    where = YamlWhere(path, yaml_line_index(text)[0])

    def field(*keys: str) -> Any:
        value: Any = raw
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    task: str | None = None
    model = field("training", "model")
    if isinstance(model, str) and model not in MODELS:
        known = ", ".join(sorted(MODELS))
        problems.append(where(("training", "model"), f"unknown model {model!r} (known: {known})"))
    dataset, fmt = field("dataset"), field("source", "format")
    if isinstance(dataset, str) and NAME_RE.match(dataset):
        try:
            contract = load_contract(dataset)
        except ContractError as e:
            problems.append(where(("dataset",), f"no usable data contract: {e}"))
        else:
            task = contract.roles.task
            kind = "image" if contract.image is not None else "table"
            if isinstance(model, str) and MODEL_INPUTS.get(model, kind) != kind:
                fits = ", ".join(sorted(m for m, k in MODEL_INPUTS.items() if k == kind))
                problems.append(
                    where(
                        ("training", "model"),
                        f"{model!r} reads {MODEL_INPUTS[model]} inputs, but {dataset!r} is a "
                        f"{kind} dataset (models for it: {fits})",
                    )
                )
            if contract.image is not None and field("scoring", "stream") is not None:
                problems.append(
                    where(
                        ("scoring", "stream"),
                        f"stream scoring takes table records (one JSON object a row), but "
                        f"{dataset!r} is an image dataset (its feature "
                        f"{contract.image.column!r} is an image)",
                    )
                )
            if isinstance(fmt, str) and contract.source.format != fmt:
                problems.append(
                    where(
                        ("source", "format"),
                        f"{fmt!r}, but the contract of {dataset!r} says {contract.source.format!r}",
                    )
                )
    named: list[tuple[Any, ...]] = []
    metrics = field("gate", "metrics")
    if isinstance(metrics, list):
        named += [(("gate", "metrics", i), m) for i, m in enumerate(metrics)]
    thresholds = field("gate", "thresholds")
    if isinstance(thresholds, dict):
        named += [(("gate", "thresholds", m), m) for m in thresholds]
    champion = field("gate", "champion", "metric")
    if champion is not None:
        named.append((("gate", "champion", "metric"), champion))
    for keys, metric in named:
        if not isinstance(metric, str):
            continue
        base = metric.split("@", 1)[0]
        if base not in KNOWN_METRICS:
            problems.append(
                where(keys, f"unknown metric {metric!r} (known: {', '.join(KNOWN_METRICS)})")
            )
        elif (
            keys == ("gate", "champion", "metric")
            and isinstance(direction := field("gate", "champion", "higher_is_better"), bool)
            and direction != HIGHER_IS_BETTER[base]
        ):
            better = "higher" if HIGHER_IS_BETTER[base] else "lower"
            problems.append(
                where(
                    ("gate", "champion", "higher_is_better"),
                    f"{direction} for {metric!r}, whose {better} values are better: the gate "
                    "would promote worse models (leave it out: it follows the metric)",
                )
            )
        if base in KNOWN_METRICS and task is not None and base not in TASK_METRICS[task]:
            problems.append(
                where(
                    keys,
                    f"metric {metric!r} does not fit a {task} model: the contract of "
                    f"{dataset!r} says roles.task: {task} (its metrics: "
                    f"{', '.join(TASK_METRICS[task])})",
                )
            )
    try:  # the training section alone: its problems on the cluster are worth knowing too
        training = TrainingConfig.model_validate(field("training"))
    except ValidationError:
        training = None
    if training is not None:
        from trainyard.k8s.profile import load_cluster_profile, training_problems

        profile = profile if profile is not None else load_cluster_profile()
        for keys, why in training_problems(profile, training):
            problems.append(where(("training", *keys), why))
    if cfg is not None and cluster:
        from trainyard.k8s.scoring import cluster_stream_problem

        if problem := cluster_stream_problem(cfg):
            problems.append(where(("scoring", "stream"), problem))
    if cfg is not None:
        others = other_pipelines(cfg)
        shared = shared_names(cfg, others=others)
        said = {keys for keys, _ in shared}  # a shared model name: its objects' names follow
        clashes = [c for c in k8s_name_clashes(cfg, others) if c[0] not in said]
        for keys, why in [*shared, *clashes]:
            problems.append(where(keys, why))
    if problems or cfg is None:
        raise InvalidPipelineConfig(path, problems)
    return cfg


def owned_names(cfg: PipelineConfig) -> dict[tuple[str, ...], tuple[str, str]]:
    """What no two pipelines may share: field → (the value, what it is compared as).

    The served model's name (case-blind: it names a folder, and a laptop's file system
    may be case-blind too), and the streams the scorer writes (scores and dead letters of
    two pipelines in one stream could not be told apart), as engine, server and name.
    """
    out: dict[tuple[str, ...], tuple[str, str]] = {
        ("serving", "model_name"): (cfg.serving.model_name, cfg.serving.model_name.casefold())
    }
    st = cfg.scoring.stream
    if st is not None:
        server = st.bootstrap_servers if st.engine == "kafka" else st.url or ""
        for name in ("output", "dead_letter"):
            value = getattr(st, name)
            out[("scoring", "stream", name)] = (value, f"stream {st.engine} {server} {value}")
        # a Redis group belongs to its stream; a Kafka group id to the whole cluster
        group = st.group or f"trainyard-{cfg.name}"
        on = st.input if st.engine == "redis" else ""
        out[("scoring", "stream", "group")] = (group, f"group {st.engine} {server} {on} {group}")
    tr = cfg.trigger.stream
    if tr is not None and tr.engine == "redis":  # a Kafka trigger's group is its connection's
        group = tr.group or f"trainyard-trigger-{cfg.name}"
        out[("trigger", "stream", "group")] = (
            group,
            f"group redis {tr.url or ''} {tr.name} {group}",
        )
    return out


def read_streams(cfg: PipelineConfig) -> dict[tuple[str, ...], tuple[str, str]]:
    """The streams ``cfg`` reads: field → (the name, what it is compared as).

    The scorer's input and the trigger stream, as engine, server and name (the form of
    :func:`owned_names`; a Kafka trigger's server is its Airflow connection).
    """
    out: dict[tuple[str, ...], tuple[str, str]] = {}
    st = cfg.scoring.stream
    if st is not None:
        server = st.bootstrap_servers if st.engine == "kafka" else st.url or ""
        out[("scoring", "stream", "input")] = (st.input, f"stream {st.engine} {server} {st.input}")
    tr = cfg.trigger.stream
    if tr is not None:
        server = tr.url or "" if tr.engine == "redis" else tr.kafka_config_id or "kafka_default"
        out[("trigger", "stream", "name")] = (tr.name, f"stream {tr.engine} {server} {tr.name}")
    return out


READ = "read "
"""Prefix of :func:`name_owners`'s keys for streams a pipeline reads (the first reader)."""


def has_models(pipeline: str) -> bool:
    """Whether the pipeline has registered a model version (it has run, maybe served)."""
    versions = get_settings().models_root / pipeline / "versions"
    return versions.is_dir() and any(versions.iterdir())


def name_owners(
    cfgs: list[PipelineConfig],
) -> dict[str, tuple[str, tuple[str, ...], str]]:
    """Who owns each of :func:`owned_names`: compared name → (pipeline, field, value).

    A pipeline that has registered models keeps its names over one that has not (a new
    copy never takes them from the pipeline that ran); between equals the file that sorts
    first does.
    """
    claims: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
    for cfg in sorted(cfgs, key=lambda c: c.name):
        for keys, (value, key) in owned_names(cfg).items():
            claims.setdefault(key, []).append((cfg.name, keys, value))
    # the models volume is looked at only for a name claimed twice (DAG parsing reads it)
    owners = {
        key: min(them, key=lambda c: not has_models(c[0])) if len(them) > 1 else them[0]
        for key, them in claims.items()
    }
    for cfg in sorted(cfgs, key=lambda c: c.name):
        for keys, (value, key) in read_streams(cfg).items():
            owners.setdefault(READ + key, (cfg.name, keys, value))
            owners.setdefault(f"{READ}{keys[0]} {key}", (cfg.name, keys, value))
    return owners


def name_clashes(
    cfg: PipelineConfig, owners: dict[str, tuple[str, tuple[str, ...], str]]
) -> list[tuple[tuple[str, ...], str]]:
    """``(field, message)`` for each name of ``cfg`` another pipeline owns (:func:`name_owners`)."""
    out = []
    own_reads = {key: keys for keys, (_, key) in read_streams(cfg).items()}
    for keys, (value, key) in owned_names(cfg).items():
        owner, owner_keys, owner_value = owners.get(key, (cfg.name, keys, value))
        if owner != cfg.name:
            out.append((keys, shared_name_message(value, owner, owner_keys, owner_value)))
        elif keys[0] == "scoring" and (READ + key in owners or key in own_reads):
            reader, reader_keys, _ = owners.get(READ + key) or (cfg.name, own_reads[key], value)
            if reader == cfg.name and key in own_reads:
                reader_keys = own_reads[key]
            out.append(
                (
                    keys,
                    f"{value!r} is the {'.'.join(reader_keys)} of pipeline {reader!r}: a "
                    "stream a scorer writes must not be one a pipeline reads (its entries "
                    "would be read as records or arrivals, and dead letters could go "
                    "round between pipelines for ever)",
                )
            )
    for keys, (value, key) in read_streams(cfg).items():
        other = "scoring" if keys[0] == "trigger" else "trigger"
        if f"{READ}{other} {key}" in owners:
            reader, reader_keys, _ = owners[f"{READ}{other} {key}"]
            out.append(
                (
                    keys,
                    f"{value!r} is the {'.'.join(reader_keys)} of pipeline {reader!r}: "
                    "records to score and messages that data arrived need streams of "
                    "their own (each record would be read as an arrival, each arrival as "
                    "a record)",
                )
            )
    return out


def other_pipelines(cfg: PipelineConfig, pipelines_dir: Path | None = None) -> list[PipelineConfig]:
    """Every other valid pipeline of the pipelines folder (those that do not parse are left out)."""
    others = []
    for path in pipeline_files(pipelines_dir):
        if path.stem == cfg.name:
            continue
        try:
            others.append(parse_pipeline(path))
        except ConfigError:
            continue
    return others


def shared_names(
    cfg: PipelineConfig,
    pipelines_dir: Path | None = None,
    others: list[PipelineConfig] | None = None,
) -> list[tuple[tuple[str, ...], str]]:
    """The names ``cfg`` shares with another valid pipeline that owns them (:func:`name_owners`).

    Args:
        cfg: The pipeline.
        pipelines_dir: Where the others are (default: settings).
        others: The other pipelines, when already read (:func:`other_pipelines`).

    Returns:
        ``(field, message)`` per name shared.
    """
    if others is None:
        others = other_pipelines(cfg, pipelines_dir)
    return name_clashes(cfg, name_owners([*others, cfg]))


def k8s_name_clashes(
    cfg: PipelineConfig, others: list[PipelineConfig]
) -> list[tuple[tuple[str, ...], str]]:
    """The Kubernetes object names ``cfg`` would render as another pipeline already does.

    Names derived from distinct config values can still meet (cut to fit, characters
    replaced, a short hash); the owner of a name is chosen as :func:`name_owners` does, so
    only the pipeline that must give way is refused.

    Returns:
        ``(field, message)`` per clash, naming both pipelines and the object.
    """
    from trainyard.k8s.objects import pipeline_object_names

    claims: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
    for c in sorted([*others, cfg], key=lambda c: c.name):
        for keys, what, name in pipeline_object_names(c):
            claims.setdefault(f"{what} {name}", []).append((c.name, keys, what))
    out = []
    for keys, what, name in pipeline_object_names(cfg):
        them = claims[f"{what} {name}"]
        if len(them) < 2:
            continue
        owner, owner_keys, _ = min(them, key=lambda c: not has_models(c[0]))
        if owner == cfg.name:
            continue
        out.append(
            (
                keys,
                f"pipelines {owner!r} ({'.'.join(owner_keys)}) and {cfg.name!r} would both "
                f"render the Kubernetes {what} {name!r}, which {owner!r} keeps: each needs "
                "its own (one would roll, select or delete the other's objects); rename "
                f"{'.'.join(keys)}",
            )
        )
    return out + _dataset_volume_clashes(cfg, others)


def _has_snapshots(dataset: str) -> bool:
    """Whether the dataset's volume holds a snapshot (it has been staged)."""
    snapshots = get_settings().volume_root / dataset / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def _dataset_volume_clashes(
    cfg: PipelineConfig, others: list[PipelineConfig]
) -> list[tuple[tuple[str, ...], str]]:
    """The dataset whose PVC name another dataset of ``others`` renders too (``a__b``, ``a_b``).

    Pipelines of one dataset share its volume; distinct datasets must not. A dataset that
    has been staged keeps the name; between equals the name that sorts first does.
    """
    from trainyard.k8s.objects import dataset_pvc_name

    pvc = dataset_pvc_name(cfg.dataset)
    rivals = sorted(
        (c for c in others if c.dataset != cfg.dataset and dataset_pvc_name(c.dataset) == pvc),
        key=lambda c: (c.dataset, c.name),
    )
    if not rivals:
        return []
    owner = min([*rivals, cfg], key=lambda c: (not _has_snapshots(c.dataset), c.dataset))
    if owner.dataset == cfg.dataset:
        return []
    return [
        (
            ("dataset",),
            f"datasets {owner.dataset!r} (pipeline {owner.name!r}) and {cfg.dataset!r} would "
            f"both use the Kubernetes PersistentVolumeClaim {pvc!r}, which {owner.dataset!r} "
            "keeps: each dataset needs a volume of its own (one's snapshots and retention "
            "would act on the other's); rename the dataset and its contract",
        )
    ]


def shared_name_message(
    value: str, owner: str, owner_keys: tuple[str, ...], owner_value: str
) -> str:
    """The message for a name pipeline ``owner`` owns (as ``owner_value`` at ``owner_keys``)."""
    theirs = ".".join(owner_keys)
    spelled = "" if owner_value == value else f" (as {owner_value!r})"
    if owner_keys == ("serving", "model_name"):
        why = "both would publish their versions into one served model, each over the other's"
    elif owner_keys[-1] == "group":
        why = "one consumer group on one stream splits its entries: each would see only some"
    else:
        why = "consumers could not tell whose scores and dead letters an entry holds"
    return (
        f"{value!r} is also{spelled} the {theirs} of pipeline {owner!r}, which keeps it: "
        f"each needs its own ({why})"
    )


def ensure_own_names(cfg: PipelineConfig) -> None:
    """Refuse to serve or score for ``cfg`` under a name a pipeline before it owns.

    Raises:
        ConfigError: Naming the field and both pipelines.
    """
    for keys, why in shared_names(cfg):
        raise ConfigError(f"pipeline {cfg.name!r}: {'.'.join(keys)}: {why}")
