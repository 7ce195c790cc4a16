"""OpenLineage for the one graph: what each step read and wrote, as datasets with facets.

``apache-airflow-providers-openlineage`` calls ``get_openlineage_facets_on_complete`` of
:class:`~trainyard.orchestration.runners.StepOperator` and
:class:`~trainyard.orchestration.runners.TrainingOperator` when a task succeeds; they hand
their resolved arguments and typed result (the XCom) to :func:`step_lineage` /
:func:`training_lineage`, which name the datasets and attach the facets. Everything comes
from the step's result and the checkout (the data contract), never from the volumes, so the
same events come out on the kubernetes runner, where the Airflow worker mounts no volume.

Datasets (namespace ``file://<volume root>``, the Airflow Assets' root too)::

    raw source (fsspec URL) ──stage──▶ <dataset>/snapshots/<id>
        ──validate (assertions)──┐
        ──train / register──▶ _models/<pipeline>/versions/<n>
        ──evaluate (gate)──▶ _models/<pipeline>/versions/<n>
        ──deploy──▶ http://<host>:<port> v1/models/<model>/versions/<n>  (the served version)

Facets:

* snapshot: ``schema`` (the contract's columns), ``trainyard_snapshot`` (snapshot id,
  manifest hash, contract version, rows, shards, bytes, reused), ``outputStatistics``;
  as validate's input ``dataQualityAssertions`` (every rule: assertion, column, success,
  severity, counts in ``params``) and ``trainyard_validation``.
* model version: ``trainyard_model`` (version, pipeline, snapshots trained on, training
  metrics, attempts, seconds, the Airflow run), and from evaluate ``trainyard_gate``
  (verdict, promote, reason, candidate and champion metrics).
* served version: ``trainyard_serving`` (model, version, URL, previous version, smoke rows).

The parent run (the DAG run) is the provider's own ``parent`` run facet on every task event.
Custom facets are named ``trainyard_*`` and declare the spec's base facet schema.

This module imports OpenLineage, so only the operators' lineage methods import it (DAG
parsing stays cheap).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import Dataset, InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    DatasetFacet,
    data_quality_assertions_dataset,
    datasource_dataset,
    documentation_dataset,
    output_statistics_output_dataset,
    schema_dataset,
)

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig
    from trainyard.settings import Settings

log = logging.getLogger("trainyard.orchestration")

FACET_PREFIX = "trainyard_"


# --------------------------------------------------------------------------- custom facets


@attr.define
class SnapshotFacet(DatasetFacet):
    """A dataset snapshot: its content-derived id and the hash of its manifest.

    Attributes:
        snapshotId: The snapshot id (BLAKE3 of kind, contract version and shard hashes).
        manifestHash: BLAKE3 of the snapshot's ``manifest.json``.
        hashAlgo: The hash of ``manifestHash`` and of the shards.
        dataset: The dataset name.
        contractVersion: The data contract's version.
        rows: Rows (tables) or samples (files).
        shards: Shard count.
        bytes: Bytes of the data shards.
        reused: True when this run staged nothing new (the same content existed).
    """

    snapshotId: str
    manifestHash: str | None = None
    hashAlgo: str = "blake3"
    dataset: str | None = None
    contractVersion: str | None = None
    rows: int | None = None
    shards: int | None = None
    bytes: int | None = None
    reused: bool | None = None


@attr.define
class ValidationFacet(DatasetFacet):
    """Outcome of validating a snapshot against its contract (assertions are separate).

    Attributes:
        success: No blocking rule failed.
        rows: Rows validated.
        rules: Rules checked.
        failed: Rules that did not pass (blocking or not).
        warnings: Non-blocking rules that did not pass.
        report: The report folder on the volume (Data Docs, ``summary.json``).
    """

    success: bool
    rows: int | None = None
    rules: int | None = None
    failed: int | None = None
    warnings: int | None = None
    report: str | None = None


@attr.define
class ModelFacet(DatasetFacet):
    """A registered model version and what it was trained on.

    Attributes:
        pipeline: The pipeline (the registry's model).
        version: The version number.
        snapshots: Snapshot ids it was trained on (the training window).
        metrics: Training metrics (the chief's ``metrics.json``).
        attempts: Training attempts used.
        seconds: Training wall-clock time.
        airflowRunId: The Airflow run that trained it.
    """

    pipeline: str
    version: int
    snapshots: list[str] = attr.field(factory=list)
    metrics: dict[str, Any] = attr.field(factory=dict)
    attempts: int | None = None
    seconds: float | None = None
    airflowRunId: str | None = None


@attr.define
class GateFacet(DatasetFacet):
    """The gate's decision on a candidate version, with the metrics it compared.

    Attributes:
        version: The candidate.
        verdict: ``promote``, ``reject`` or ``forced``.
        promote: Whether it goes on to deployment.
        reason: The gate's reason in one sentence.
        metrics: The candidate's holdout metrics.
        champion: The champion it was compared with (None on a first run).
        championMetrics: The champion's holdout metrics.
    """

    version: int
    verdict: str
    promote: bool
    reason: str = ""
    metrics: dict[str, Any] = attr.field(factory=dict)
    champion: int | None = None
    championMetrics: dict[str, Any] = attr.field(factory=dict)


@attr.define
class ServingFacet(DatasetFacet):
    """A model version served (TF Serving's REST API).

    Attributes:
        model: The served model's name.
        version: The version served.
        url: Its predict URL.
        previous: The champion it replaced (None if it is the first).
        smokeRows: Holdout rows its smoke test checked.
    """

    model: str
    version: int
    url: str
    previous: int | None = None
    smokeRows: int | None = None


# --------------------------------------------------------------------------- dataset names


def volume_namespace(settings: Settings) -> str:
    """The namespace of snapshots and model versions: the volume root as a file URI."""
    return f"file://{settings.volume_root}"


def snapshot_name(dataset: str, snapshot_id: str) -> str:
    """A snapshot's dataset name: ``<dataset>/snapshots/<id>``."""
    return f"{dataset}/snapshots/{snapshot_id}"


def model_name(pipeline: str, version: int) -> str:
    """A model version's dataset name: ``_models/<pipeline>/versions/<n>``."""
    return f"_models/{pipeline}/versions/{int(version)}"


def served_dataset(url: str) -> tuple[str, str]:
    """Namespace and name of a served version from its predict URL.

    ``http://127.0.0.1:8501/v1/models/digits/versions/1:predict`` becomes
    ``("http://127.0.0.1:8501", "v1/models/digits/versions/1")``.
    """
    parts = urlsplit(url)
    path = parts.path.split(":", 1)[0].strip("/")
    return f"{parts.scheme}://{parts.netloc}", path


def source_dataset(url: str) -> tuple[str, str]:
    """Namespace and name of a raw source (OpenLineage's naming for files and stores).

    A local path is namespace ``file`` and its absolute path; an fsspec URL is
    ``<scheme>://<bucket or host>`` and its path. Credentials are masked first.
    """
    from trainyard.fsutil import redact_url

    url = redact_url(url)
    if "://" not in url:
        return "file", url
    parts = urlsplit(url)
    if parts.scheme == "file":
        return "file", parts.path
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/") or "/"


# --------------------------------------------------------------------------- facets


def schema_facet(dataset: str) -> schema_dataset.SchemaDatasetFacet | None:
    """The ``schema`` facet from the dataset's data contract (its columns, in order)."""
    from trainyard.contracts import load_contract

    try:
        contract = load_contract(dataset)
    except Exception as e:  # lineage never fails a task
        log.warning("lineage: no schema facet for %s: %s", dataset, e)
        return None
    return schema_dataset.SchemaDatasetFacet(
        fields=[
            schema_dataset.SchemaDatasetFacetFields(
                name=c.name,
                type=c.type,
                description=c.description or None,
                ordinal_position=i,
            )
            for i, c in enumerate(contract.columns, start=1)
        ]
    )


def assertions_facet(
    rules: Sequence[Mapping[str, Any]],
) -> data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet:
    """The ``dataQualityAssertions`` facet: one assertion per contract rule outcome.

    Args:
        rules: ``validate``'s ``rules`` (rule, column, severity, success, counts, reason).

    Returns:
        The facet: ``actual`` is the unexpected count (``expected`` 0) or the observed
        value of a dataset-level rule; ``params`` holds ``unexpected_count``,
        ``element_count`` and ``observed``.
    """
    assertions = []
    for r in rules:
        params = {
            k: r[k]
            for k in ("unexpected_count", "element_count", "observed")
            if r.get(k) is not None
        }
        unexpected, observed = r.get("unexpected_count"), r.get("observed")
        actual = observed if unexpected is None else unexpected
        assertions.append(
            data_quality_assertions_dataset.Assertion(
                assertion=str(r.get("rule")),
                success=bool(r.get("success")),
                column=r.get("column") or None,
                severity=r.get("severity") or None,
                description=r.get("reason") or None,
                actual=None if actual is None else str(actual),
                expected=None if unexpected is None else "0",
                params=params,
            )
        )
    return data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(assertions=assertions)


def _snapshot(
    settings: Settings,
    cfg: PipelineConfig,
    snapshot_id: str,
    cls: type[Dataset] = Dataset,
    facets: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    ds_facets: dict[str, Any] = {
        "documentation": documentation_dataset.DocumentationDatasetFacet(
            description=f"snapshot {snapshot_id} of dataset {cfg.dataset}"
        ),
    }
    schema = schema_facet(cfg.dataset)
    if schema is not None:
        ds_facets["schema"] = schema
    ds_facets.update(facets or {})
    return cls(
        namespace=volume_namespace(settings),
        name=snapshot_name(cfg.dataset, snapshot_id),
        facets=ds_facets,
        **kwargs,
    )


def _model(
    settings: Settings,
    cfg: PipelineConfig,
    version: int,
    cls: type[Dataset] = Dataset,
    facets: dict[str, Any] | None = None,
) -> Any:
    return cls(
        namespace=volume_namespace(settings),
        name=model_name(cfg.name, version),
        facets={
            "documentation": documentation_dataset.DocumentationDatasetFacet(
                description=f"version {int(version)} of model {cfg.name}"
            ),
            **(facets or {}),
        },
    )


def _ids(value: Any) -> list[str]:
    """Snapshot ids of a training window (``validate``'s entries or plain ids)."""
    ids = []
    for item in value or []:
        sid = item.get("snapshot_id") if isinstance(item, Mapping) else item
        if isinstance(sid, str) and sid:
            ids.append(sid)
    return list(dict.fromkeys(ids))


# --------------------------------------------------------------------------- per step


def step_lineage(
    step: str,
    cfg: PipelineConfig,
    values: Mapping[str, Any] | None,
    result: Mapping[str, Any] | None,
    run_id: str | None = None,
    settings: Settings | None = None,
) -> OperatorLineage:
    """The lineage of one finished step: inputs and outputs with their facets.

    Args:
        step: The step (``stage``, ``validate``, ``register``, ``evaluate``, ``deploy``...).
        cfg: The pipeline config.
        values: The step's resolved arguments.
        result: The step's result (its XCom); None when it returned nothing.
        run_id: The Airflow run.
        settings: Locations (defaults to the environment's).

    Returns:
        The operator lineage (empty for steps that read or write no dataset).
    """
    from trainyard.settings import get_settings

    settings = settings or get_settings()
    values, result = values or {}, result or {}
    builder = _BUILDERS.get(step)
    if builder is None or not result:
        return OperatorLineage()
    return builder(settings, cfg, values, result, run_id)


def _stage(
    settings: Settings,
    cfg: PipelineConfig,
    values: Mapping[str, Any],
    result: Mapping[str, Any],
    run_id: str | None,
) -> OperatorLineage:
    from trainyard.contracts import load_contract

    sid = result["snapshot_id"]
    try:
        contract_version: str | None = load_contract(cfg.dataset).version
    except Exception:  # lineage never fails a task
        contract_version = None
    facets: dict[str, Any] = {
        f"{FACET_PREFIX}snapshot": SnapshotFacet(
            snapshotId=sid,
            manifestHash=result.get("manifest_hash"),
            dataset=cfg.dataset,
            contractVersion=contract_version,
            rows=result.get("rows"),
            shards=result.get("shards"),
            bytes=result.get("bytes"),
            reused=result.get("reused"),
        )
    }
    output_facets = {}
    if result.get("rows") is not None:
        output_facets["outputStatistics"] = (
            output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=result.get("rows"),
                size=result.get("bytes"),
                fileCount=result.get("shards"),
            )
        )
    output = _snapshot(settings, cfg, sid, OutputDataset, facets, outputFacets=output_facets)
    inputs = []
    if not result.get("given"):
        start = result.get("interval_start") or values.get("interval_start")
        url = cfg.source_url(str(start)[:10] if start else None)
        namespace, name = source_dataset(url)
        inputs.append(
            InputDataset(
                namespace=namespace,
                name=name,
                facets={
                    "datasource": datasource_dataset.DatasourceDatasetFacet(
                        name=namespace,
                        uri=f"file://{name}"
                        if namespace == "file"
                        else f"{namespace}/{name.lstrip('/')}",
                    )
                },
            )
        )
    return OperatorLineage(inputs=inputs, outputs=[output])


def _validate(
    settings: Settings,
    cfg: PipelineConfig,
    values: Mapping[str, Any],
    result: Mapping[str, Any],
    run_id: str | None,
) -> OperatorLineage:
    sid = result.get("snapshot_id") or values["snapshot_id"]
    rules = result.get("rules") or []
    failed = [r for r in rules if not r.get("success")]
    facets = {
        f"{FACET_PREFIX}snapshot": SnapshotFacet(snapshotId=sid, dataset=cfg.dataset),
        f"{FACET_PREFIX}validation": ValidationFacet(
            success=bool(result.get("success")),
            rows=result.get("rows"),
            rules=len(rules),
            failed=len(failed),
            warnings=result.get("warnings"),
            report=result.get("report_dir"),
        ),
    }
    snapshot = _snapshot(
        settings,
        cfg,
        sid,
        InputDataset,
        facets,
        inputFacets={"dataQualityAssertions": assertions_facet(rules)} if rules else {},
    )
    return OperatorLineage(inputs=[snapshot])


def _register(
    settings: Settings,
    cfg: PipelineConfig,
    values: Mapping[str, Any],
    result: Mapping[str, Any],
    run_id: str | None,
) -> OperatorLineage:
    version = int(result["version"])
    ids = _ids(result.get("snapshots")) or _ids([values.get("snapshot_id")])
    model = _model(
        settings,
        cfg,
        version,
        OutputDataset,
        {
            f"{FACET_PREFIX}model": ModelFacet(
                pipeline=cfg.name,
                version=version,
                snapshots=ids,
                metrics=dict(result.get("metrics") or {}),
                attempts=result.get("attempts"),
                seconds=result.get("seconds"),
                airflowRunId=run_id or values.get("run_id"),
            )
        },
    )
    inputs = [_snapshot(settings, cfg, sid, InputDataset) for sid in ids]
    return OperatorLineage(inputs=inputs, outputs=[model])


def _evaluate(
    settings: Settings,
    cfg: PipelineConfig,
    values: Mapping[str, Any],
    result: Mapping[str, Any],
    run_id: str | None,
) -> OperatorLineage:
    version = int(result.get("version") or values["version"])
    champion = result.get("champion")
    gate = GateFacet(
        version=version,
        verdict=str(result.get("verdict")),
        promote=bool(result.get("promote")),
        reason=str(result.get("reason") or ""),
        metrics=dict(result.get("metrics") or {}),
        champion=champion,
        championMetrics=dict(result.get("champion_metrics") or {}),
    )
    inputs = [_model(settings, cfg, version, InputDataset)]
    if champion is not None and int(champion) != version:
        inputs.append(_model(settings, cfg, int(champion), InputDataset))
    output = _model(settings, cfg, version, OutputDataset, {f"{FACET_PREFIX}gate": gate})
    return OperatorLineage(inputs=inputs, outputs=[output])


def _deploy(
    settings: Settings,
    cfg: PipelineConfig,
    values: Mapping[str, Any],
    result: Mapping[str, Any],
    run_id: str | None,
) -> OperatorLineage:
    version = int(result.get("version") or values["version"])
    url = str(result.get("url") or "")
    if not url:
        return OperatorLineage(inputs=[_model(settings, cfg, version, InputDataset)])
    namespace, name = served_dataset(url)
    served = OutputDataset(
        namespace=namespace,
        name=name,
        facets={
            "documentation": documentation_dataset.DocumentationDatasetFacet(
                description=f"version {version} of model {cfg.serving.model_name}, served"
            ),
            f"{FACET_PREFIX}serving": ServingFacet(
                model=cfg.serving.model_name,
                version=version,
                url=url,
                previous=result.get("previous"),
                smokeRows=result.get("smoke_rows"),
            ),
        },
    )
    return OperatorLineage(inputs=[_model(settings, cfg, version, InputDataset)], outputs=[served])


_BUILDERS = {
    "stage": _stage,
    "validate": _validate,
    "register": _register,
    "evaluate": _evaluate,
    "deploy": _deploy,
}


def failed_step_lineage(
    step: str,
    cfg: PipelineConfig,
    values: Mapping[str, Any] | None,
    settings: Settings | None = None,
) -> OperatorLineage:
    """The lineage of a failed step: for ``validate``, the rejected snapshot's assertions.

    A blocking rule fails the step before it returns a result, so the assertions come from
    the rejection report it wrote next to the snapshot (``validation/rejected.json``), where
    this process can read the volume (the local runner); otherwise (or after a crash of the
    validator, which writes no rejection) the snapshot is named without them.

    Args:
        step: The step that failed.
        cfg: The pipeline config.
        values: The step's resolved arguments.
        settings: Locations (defaults to the environment's).

    Returns:
        The operator lineage (empty for other steps).
    """
    from trainyard.settings import get_settings

    settings = settings or get_settings()
    values = values or {}
    sid = values.get("snapshot_id")
    if step != "validate" or not isinstance(sid, str) or not sid:
        return OperatorLineage()
    summary: dict[str, Any] = {}
    try:
        from trainyard import volumes
        from trainyard.fsutil import read_json

        report = volumes.snapshot_dir(cfg.dataset, sid, settings.volume_root) / "validation"
        # written only when a blocking rule failed (an image that does not decode too)
        if (report / "rejected.json").is_file():
            summary = read_json(report / "rejected.json")
            summary["report_dir"] = str(report)
    except Exception as e:  # lineage never fails a task
        log.warning("lineage: no validation report for %s: %s", sid, e)
    if summary.get("snapshot_id") not in (None, sid):
        summary = {}
    from trainyard.steps import rule_result

    rules = [rule_result(r) for r in summary.get("rules") or []]
    result = {
        "snapshot_id": sid,
        "success": bool(summary.get("success", False)),
        "rows": summary.get("rows"),
        "warnings": len(summary.get("warnings") or []) if summary else None,
        "report_dir": summary.get("report_dir"),
        "rules": rules,
    }
    return _validate(settings, cfg, values, result, None)


def training_lineage(
    cfg: PipelineConfig,
    result: Mapping[str, Any] | None,
    settings: Settings | None = None,
) -> OperatorLineage:
    """The lineage of a finished training: the snapshots of its window, as inputs.

    Its output becomes a model version only when ``register`` numbers it, so that step's
    event carries the model version.

    Args:
        cfg: The pipeline config.
        result: The training task's result (``snapshot_id``, ``window``).
        settings: Locations (defaults to the environment's).

    Returns:
        The operator lineage.
    """
    from trainyard.settings import get_settings

    settings = settings or get_settings()
    result = result or {}
    ids = _ids(result.get("window")) or _ids([result.get("snapshot_id")])
    return OperatorLineage(inputs=[_snapshot(settings, cfg, sid, InputDataset) for sid in ids])
