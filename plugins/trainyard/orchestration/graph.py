"""One task graph per pipeline, for both runners: pipeline configs become DAGs.

One DAG per ``dags/pipelines/<name>.yaml``, all with the same shape, whatever the runner::

    stage ─▶ validate ─▶ train ─▶ register ─▶ evaluate ─▶ gate ─▶ deploy ─▶ summary
                  └──▶ publish_snapshot (Asset event of a new validated snapshot)

Each step task is a :class:`~trainyard.orchestration.runners.StepOperator` for an entry of
the step table (:data:`trainyard.steps.STEPS`), whose arguments are declared here as where
their values come from (:class:`FromXCom`, :class:`FromParam`, :class:`FromRun`); training
is a :class:`~trainyard.orchestration.runners.TrainingOperator`. The runner setting
(``TRAINYARD_RUNNER``) decides only how a step's rendered pod executes (a local process,
or a pod on the cluster), never which tasks exist or how failures are treated. Nothing
here does I/O at import time beyond reading the small pipeline YAML files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.sdk import DAG, Asset, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainyard.config import (
    PipelineConfig,
    parse_pipeline,
    pipeline_files,
    training_pool_name,
    unknown_tier_message,
)
from trainyard.errors import ConfigError
from trainyard.orchestration.inputs import FromParam, FromRun, FromXCom, Results
from trainyard.orchestration.notify import PersonRejectedMail
from trainyard.orchestration.notify import callbacks as notify_callbacks
from trainyard.orchestration.runners import StepOperator, TrainingOperator
from trainyard.pipelines import name_clashes, name_owners
from trainyard.registry import MAX_REASON_CHARS
from trainyard.settings import Settings, get_settings

log = logging.getLogger("trainyard.orchestration")

STEP_TASKS = ("stage", "validate", "train", "register", "evaluate", "deploy")
"""The tasks whose results the summary records."""


def snapshot_asset(cfg: PipelineConfig, settings: Settings) -> Asset:
    """The Asset updated whenever a pipeline's dataset gets a new validated snapshot."""
    return Asset(
        name=f"trainyard.dataset.{cfg.dataset}",
        uri=f"file://{settings.volume_root}/{cfg.dataset}/snapshots",
        group="trainyard-datasets",
    )


def model_asset(cfg: PipelineConfig, settings: Settings) -> Asset:
    """The Asset updated whenever a pipeline promotes and serves a new model version."""
    return Asset(
        name=f"trainyard.model.{cfg.name}",
        uri=f"file://{settings.models_root}/{cfg.name}/champion.json",
        group="trainyard-models",
    )


@cache
def _tiers(profile_path: Path) -> tuple[str, ...]:
    """Priority tier names of the cluster profile, for the trigger form's enum.

    Only the tier names are read here (DAG parsing stays cheap); the profile as a whole is
    validated by ``trainyard.k8s.load_cluster_profile`` in tests and wherever pods render.
    """
    from trainyard.fsutil import load_yaml

    try:
        tiers = load_yaml(profile_path.read_text(encoding="utf-8")).get("tiers") or {}
    except (OSError, AttributeError) as e:
        raise ConfigError(f"{profile_path}: cannot read the cluster profile's tiers: {e}") from e
    if not tiers:
        raise ConfigError(f"{profile_path}: the cluster profile declares no tiers")
    return tuple(tiers)


WORKER_MEMORY_GB = 1.0
"""What one local training worker may take (TensorFlow + tf.data), for the form's cap."""


def max_workers() -> int:
    """The trigger form's cap on workers: what this machine can run, on the local runner.

    On a cluster the Jobs' pods queue for GPUs, so the cap is the config's own (64); on a
    laptop every worker is a process here: at most two per core and one per GB of memory.
    """
    return 64 if get_settings().runner != "local" else _local_cap()


@cache
def _local_cap() -> int:
    """This machine's cap (its cores and memory do not change while it runs)."""
    cores = os.cpu_count() or 1
    try:
        memory_gb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gb = 4.0
    return max(1, min(64, 2 * cores, int(memory_gb / WORKER_MEMORY_GB)))


def trigger_params(cfg: PipelineConfig, tiers: tuple[str, ...]) -> dict[str, Param]:
    """The typed trigger form: every field defaults to the pipeline config.

    Args:
        cfg: The pipeline config.
        tiers: Priority tiers of the cluster profile (the ``priority`` enum).

    Returns:
        Params keyed by name, each with a type, a description and a UI section.
    """
    t = cfg.training
    return {
        "snapshot_id": Param(
            None,
            type=["null", "string"],
            title="Snapshot id",
            description="Train on this existing snapshot instead of staging the data interval.",
            section="Data",
        ),
        "epochs": Param(
            t.epochs,
            type="integer",
            minimum=0,
            maximum=1000,
            title="Epochs",
            description="Passes over the training window's data (0 trains nothing: its "
            "candidate is what the gate's rejection looks like).",
            section="Training",
        ),
        "workers": Param(
            t.workers,
            type="integer",
            minimum=1,
            maximum=max_workers(),
            title="Workers",
            description="Number of training workers (local processes or GPU pods).",
            section="Training",
        ),
        "strategy": Param(
            t.strategy,
            type="string",
            enum=["multi_worker_mirrored", "parameter_server"],
            title="Strategy",
            description="All-reduce (MultiWorkerMirrored) or parameter servers.",
            section="Training",
        ),
        "priority": Param(
            t.priority if t.priority in tiers else tiers[0],
            type="string",
            enum=list(tiers),
            title="Priority tier",
            description="Which GPU pools the workers may use (see deploy/cluster_profile.yaml).",
            section="Training",
        ),
        "force_retrain": Param(
            False,
            type="boolean",
            title="Force retrain",
            description="Train even if a version was trained on the same inputs (snapshots, "
            "config, seed, code, image): otherwise that version is reused and gated again.",
            section="Training",
        ),
        "force_promote": Param(
            False,
            type="boolean",
            title="Force promote",
            description="Promote even if the gate rejects; recorded with who, when and why.",
            section="Promotion",
        ),
        "force_reason": Param(
            None,
            type=["null", "string"],
            maxLength=MAX_REASON_CHARS,
            title="Reason for forcing",
            description="Required when force promote is on (recorded with who and when).",
            section="Promotion",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Stage and validate, log the training plan, then stop before training.",
            section="Run",
        ),
    }


def pipeline_schedule(cfg: PipelineConfig, settings: Settings) -> Any:
    """The pipeline's schedule: its cron (with data intervals), or-ed with its Assets.

    The Assets: the dataset's (``trigger_on_dataset``) and the arrivals stream's
    (``trigger.stream``, watched in the triggerer); an event of either starts a run.

    Args:
        cfg: The pipeline config.
        settings: Locations (the Asset URI names the dataset's volume).

    Returns:
        A timetable, an Asset condition, ``AssetOrTimeSchedule`` or ``None`` (manual only).
    """
    from airflow.sdk import AssetAny, AssetOrTimeSchedule, CronDataIntervalTimetable

    from trainyard.orchestration.stream_trigger import arrivals_asset

    cron = CronDataIntervalTimetable(cfg.schedule, timezone="UTC") if cfg.schedule else None
    assets = [snapshot_asset(cfg, settings)] if cfg.trigger_on_dataset else []
    if (arrivals := arrivals_asset(cfg)) is not None:
        assets.append(arrivals)
    if not assets:
        return cron
    condition = assets[0] if len(assets) == 1 else AssetAny(*assets)
    return AssetOrTimeSchedule(timetable=cron, assets=condition) if cron else condition


def publish_snapshot(
    staged: dict[str, Any], validated: dict[str, Any], dataset: str, pipeline: str, **context: Any
) -> str:
    """Announce a new validated snapshot as an event of the dataset's Asset (the task's outlet).

    Airflow emits an event for every outlet of a task that succeeds, so the announcement is
    a task of its own that skips (no event) when the snapshot was reused: unchanged data is
    no news, and a pipeline triggered by its own dataset must not trigger itself again.

    Args:
        staged: ``stage``'s result.
        validated: ``validate``'s result (the task runs once the snapshot passed).
        dataset: The dataset's name, for the event.
        pipeline: The pipeline's name, for the event.
        **context: The task's context (its outlet, ``outlet_events``).

    Returns:
        The snapshot id.

    Raises:
        AirflowSkipException: If the snapshot was reused (no event).
    """
    if staged.get("reused"):
        raise AirflowSkipException(f"snapshot {staged['snapshot_id']} was reused: no event")
    (asset,) = context["task"].outlets
    context["outlet_events"][asset].extra = {
        "snapshot_id": staged["snapshot_id"],
        "dataset": dataset,
        "pipeline": pipeline,
    }
    return staged["snapshot_id"]


def _failure_callback() -> Callable[[Any], None] | None:
    """A failure notifier named by ``TRAINYARD_FAILURE_NOTIFIER`` (``module:attribute``).

    Any Airflow notifier instance or callback works, e.g. an SmtpNotifier or SlackNotifier
    created in a small module of your own.
    """
    spec = get_settings().failure_notifier
    if not spec:
        return None
    import importlib

    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _doc_md(cfg: PipelineConfig) -> str:
    from trainyard.fsutil import redact_url

    t, g = cfg.training, cfg.gate
    bounds = []
    for metric, th in g.thresholds.items():
        if th.min is not None:
            bounds.append(f"{metric} ≥ {th.min}")
        if th.max is not None:
            bounds.append(f"{metric} ≤ {th.max}")
    champion = g.champion.metric if g.champion else "not compared"
    return f"""### {cfg.name}

{cfg.description}

| | |
|---|---|
| dataset | `{cfg.dataset}` (contract `data_contracts/{cfg.dataset}.yaml`) |
| source | `{redact_url(cfg.source.url)}` ({cfg.source.format}) |
| training | `{t.model}`, {t.strategy}, {t.workers} workers, {t.epochs} epochs, `{t.priority}` |
| gate | {", ".join(bounds) or "no thresholds"}; champion compared on: {champion} |
| serving | model `{cfg.serving.model_name}` |

Steps: stage → validate → train → evaluate → gate → deploy → summary. Trigger with the form to
change epochs, workers, strategy or priority, to train on an existing snapshot, or to force a
promotion (with a reason). Config: `dags/pipelines/{cfg.name}.yaml`.
"""


def build_dag(cfg: PipelineConfig, settings: Settings | None = None) -> DAG:
    """Build the DAG of one pipeline.

    Args:
        cfg: The pipeline config.
        settings: Runner and locations (defaults to the environment's).

    Returns:
        The DAG ``trainyard_<pipeline>``.

    Raises:
        ConfigError: If a default of the trigger form is one its own schema refuses (a
            ``training.workers`` above what this machine can run).
    """
    settings = settings or get_settings()
    t = cfg.training
    schedule = pipeline_schedule(cfg, settings)
    default_args: dict[str, Any] = {
        "owner": cfg.owner,
        "retries": 0,
        "retry_delay": dt.timedelta(seconds=30),
    }
    mails = notify_callbacks(cfg.notify, cfg.name)
    if "failure" in mails:
        default_args["on_failure_callback"] = mails["failure"]
    form = trigger_params(cfg, _tiers(settings.cluster_profile))
    check_form_defaults(form, f"pipeline {cfg.name!r}")
    dag = DAG(
        dag_id=f"trainyard_{cfg.name}",
        description=cfg.description or None,
        schedule=schedule,
        start_date=dt.datetime.combine(cfg.start_date, dt.time(), tzinfo=dt.UTC),
        catchup=cfg.catchup,
        max_active_runs=1,
        tags=["trainyard", cfg.dataset, *cfg.tags],
        doc_md=_doc_md(cfg),
        default_args=default_args,
        on_failure_callback=_failure_callback(),
        dagrun_timeout=dt.timedelta(seconds=t.attempt_timeout_s * t.max_attempts + 3600),
        auto_register=False,  # the DAG file declares what build_dags returns, no more
    )
    with dag:
        wire(cfg, settings)
    attach_trigger_form(dag, form)
    return dag


@cache
def _form_validator(schema_json: str) -> Any:
    """A compiled JSON schema validator of one trigger-form field, its schema checked once."""
    from jsonschema import FormatChecker
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=FormatChecker())


def check_form_defaults(form: Mapping[str, Param], what: str) -> None:
    """Check each default of a trigger form against its field's schema, as Airflow does.

    A scheduled Airflow DAG refuses a form whose defaults its schemas refuse; this is
    the same check (the JSON Schema draft the schema names, formats checked), with one
    compiled validator per distinct schema instead of Airflow's metaschema check of each
    field of each DAG (:func:`attach_trigger_form`).

    Args:
        form: Field name → Param.
        what: Whose form it is, for the error.

    Raises:
        ConfigError: Naming the field and why its default is refused.
    """
    from jsonschema.exceptions import best_match

    for name, param in form.items():
        validator = _form_validator(json.dumps(param.schema, sort_keys=True))
        if (error := best_match(validator.iter_errors(param.value))) is not None:
            raise ConfigError(
                f"{what}: the trigger form's {name!r} defaults to {param.value!r}, which its "
                f"field refuses: {error.message}"
            )


def attach_trigger_form(dag: DAG, form: Mapping[str, Param]) -> None:
    """Give a DAG whose tasks exist its trigger form (``dag.params``), defaults checked.

    Airflow deep-copies a DAG's params into every task made inside it, and its serializer
    then writes each task's copy and compares it with the default, checking every field's
    schema against the JSON Schema metaschema each time: 70 ms of CPU a DAG of ours in the
    dag-processor, over two minutes at 2,000 pipelines. A task reads the form from its DAG
    when it runs (Airflow puts the DAG's params under the task's own), so the tasks are
    made first and the form given to the DAG after; its defaults are checked by
    :func:`check_form_defaults` (``build_dag`` calls it before building anything).
    Assigned the way Airflow's own converter assigns them, without its per-DAG re-check.

    Args:
        dag: The DAG, its tasks made.
        form: Field name → Param.
    """
    from airflow.sdk.definitions.param import ParamsDict

    object.__setattr__(dag, "params", ParamsDict(dict(form)))


def wire(cfg: PipelineConfig, settings: Settings) -> None:
    """Add the pipeline's tasks to the DAG being defined: the one graph of both runners.

    Args:
        cfg: The pipeline config.
        settings: Locations (the Assets name them).
    """
    from trainyard.orchestration.stream_trigger import arrivals_asset

    t = cfg.training
    snap_asset, mdl_asset = snapshot_asset(cfg, settings), model_asset(cfg, settings)
    snapshot, version = FromXCom("stage", "snapshot_id"), FromXCom("register", "version")

    def step(name: str, inputs: dict[str, Any], **kwargs: Any) -> StepOperator:
        return StepOperator(task_id=name, step=name, pipeline=cfg, inputs=inputs, **kwargs)

    # a pipeline started by arriving data stages the interval its arrivals task picked
    arrivals = arrivals_asset(cfg)
    interval: tuple[Any, Any] = (
        FromRun("interval_start", cfg.schedule),
        FromRun("interval_end", cfg.schedule),
    )
    if arrivals is not None:
        interval = (FromXCom("arrivals", "interval_start"), FromXCom("arrivals", "interval_end"))
    stage = step(
        "stage",
        {
            "interval_start": interval[0],
            "interval_end": interval[1],
            "snapshot_id": FromRun("requested_snapshot"),
        },
        retries=2,
        execution_timeout=dt.timedelta(hours=2),
    )
    if arrivals is not None:
        from trainyard.orchestration.stream_trigger import arrivals_task

        arrivals_task(cfg, arrivals) >> stage
    if cfg.source.when_missing == "wait":
        from trainyard.orchestration.sensors import SourcePartitionSensor

        SourcePartitionSensor(task_id="wait_for_source", pipeline=cfg) >> stage
    validate = step(
        "validate",
        # the training window ends at the interval staged (none for a given snapshot)
        {"snapshot_id": snapshot, "interval_start": FromXCom("stage", "interval_start")},
        retries=1,
        execution_timeout=dt.timedelta(hours=2),
    )
    train = TrainingOperator(
        task_id="train",
        pipeline=cfg,
        snapshot_id=snapshot,
        window=FromXCom("validate", "window"),
        retries=1,
        pool=training_pool_name(settings.runner, cfg.training.priority),
        execution_timeout=dt.timedelta(seconds=t.attempt_timeout_s * t.max_attempts + 600),
    )
    register = step(
        "register",
        {
            "snapshot_id": snapshot,
            "run_id": FromRun("run_id"),
            "training": FromXCom("train", "training"),
            "seconds": FromXCom("train", "seconds"),
            "attempts": FromXCom("train", "attempts"),
            "fingerprint": FromXCom("train", "fingerprint"),
            "reused": FromXCom("train", "reused"),
            "decision": FromXCom("train", "decision"),
        },
        retries=1,
        execution_timeout=dt.timedelta(minutes=30),
    )
    evaluate = step(
        "evaluate",
        {
            "version": version,
            "force_promote": FromParam("force_promote"),
            "force_reason": FromParam("force_reason"),
            "actor": FromRun("actor"),
        },
        execution_timeout=dt.timedelta(hours=1),
    )

    mails = notify_callbacks(cfg.notify, cfg.name)

    rejected = mails.get("rejection")
    # with fail_run_on_reject a rejection fails the gate: that failure is mailed as one
    gate_failed = rejected if cfg.gate.fail_run_on_reject and rejected else mails.get("failure")

    # plain operators around library functions: @task's per-call signature and type-hint
    # inspection cost more than the step operators do, at every parse of every pipeline
    gate = ShortCircuitOperator(
        task_id="gate",
        python_callable=passes_gate,
        op_args=[evaluate.output, cfg.gate.fail_run_on_reject],
        ignore_downstream_trigger_rules=False,
        on_skipped_callback=rejected,
        on_failure_callback=gate_failed,
    )
    approve = None
    deploy_inputs: dict[str, Any] = {"version": version, "actor": FromRun("actor")}
    if cfg.gate.approval == "required":
        from trainyard.orchestration.approval import approval_task

        approve = approval_task(
            cfg, PersonRejectedMail(rejected.notify, cfg.name) if rejected else None
        )
    deploy = step(
        "deploy",
        deploy_inputs,
        # a DeployError (smoke test, not AVAILABLE) is final; a killed deploy is tried
        # again, starting by serving the champion alone
        retries=1,
        outlets=[mdl_asset],
        execution_timeout=dt.timedelta(minutes=30),
        on_success_callback=mails.get("promotion"),
    )
    summary = step(
        "summary",
        {"run_id": FromRun("run_id"), "results": Results(STEP_TASKS)},
        trigger_rule="none_failed",
    )
    stage >> validate >> train >> register >> evaluate
    PythonOperator(
        task_id="publish_snapshot",
        python_callable=publish_snapshot,
        op_kwargs={
            "staged": stage.output,
            "validated": validate.output,
            "dataset": cfg.dataset,
            "pipeline": cfg.name,
        },
        outlets=[snap_asset],
    )
    if approve is not None:
        gate >> approve >> deploy >> summary
    else:
        gate >> deploy >> summary


def passes_gate(decision: dict[str, Any], fail_run_on_reject: bool) -> bool:
    """Turn a gate decision into "deploy or not"; log the reason either way.

    Args:
        decision: ``steps.evaluate``'s result.
        fail_run_on_reject: Pipeline setting: a rejection fails the run instead of skipping.

    Returns:
        True to deploy.

    Raises:
        AirflowSkipException: On rejection: the gate task ends ``skipped`` with the reason
            (deploy skips with it, the summary still runs, the run succeeds); and when
            the candidate is the champion (``keep``: a run that reused it).
        AirflowFailException: On rejection when ``fail_run_on_reject`` is set.
    """
    if decision.get("promote"):
        log.info("gate: %s — %s", decision.get("verdict"), decision.get("reason"))
        return True
    if decision.get("verdict") == "keep":  # the champion itself, reused: nothing to ship
        log.info("gate: keep — %s", decision.get("reason"))
        raise AirflowSkipException(f"nothing to deploy: {decision.get('reason')}")
    log.warning("gate: REJECTED — %s", decision.get("reason"))
    if fail_run_on_reject:
        raise AirflowFailException(f"gate rejected the candidate: {decision.get('reason')}")
    raise AirflowSkipException(f"gate rejected the candidate: {decision.get('reason')}")


def broken_dag(path: Path, error: Exception, dag_id: str | None = None) -> DAG:
    """A stand-in DAG for a pipeline config that does not load: it shows the error.

    One bad YAML file must not hide every other pipeline (an exception in the DAG file
    would): its DAG ``trainyard_<stem>`` appears paused, tagged ``invalid-config``, with the
    error as its description and docs, and its only task fails with that error.

    Args:
        path: The pipeline file.
        error: Why it does not load (a ``ConfigError``, or whatever building its DAG raised).
        dag_id: Its id (default: :func:`stem_dag_id`).

    Returns:
        The stand-in DAG.
    """
    message = str(error) if isinstance(error, ConfigError) else f"{path}: {error!r}"

    @task(task_id=INVALID_CONFIG_TASK)
    def invalid_config() -> None:
        raise AirflowFailException(message)

    dag = DAG(
        dag_id=dag_id or stem_dag_id(path),
        description=f"invalid pipeline config: {message.splitlines()[0]}"[:250],
        schedule=None,
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        is_paused_upon_creation=True,
        tags=["trainyard", "invalid-config"],
        doc_md=f"### Invalid pipeline config\n\n```\n{message}\n```\n",
        auto_register=False,
    )
    with dag:
        invalid_config()
    return dag


INVALID_CONFIG_TASK = "invalid_config"
"""The one task of a :func:`broken_dag`."""


def stem_dag_id(path: Path) -> str:
    """The DAG id a pipeline file's DAG gets: ``trainyard_<stem>``, made a valid id.

    A valid pipeline's name is its file's stem, so this is its DAG's id too; a broken file
    whose id a working pipeline holds gets :func:`suffixed_dag_id` instead.
    """
    return f"trainyard_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)[:200]}"


def suffixed_dag_id(path: Path) -> str:
    """The id of a broken file's stand-in when its :func:`stem_dag_id` is taken."""
    return f"{stem_dag_id(path)}_{hashlib.sha1(path.name.encode()).hexdigest()[:8]}"


def _pipeline_dag(path: Path, cfg: PipelineConfig | ConfigError, settings: Settings) -> DAG:
    """One file's DAG, or its stand-in: whatever building it raises stays with it."""
    try:
        if isinstance(cfg, ConfigError):
            raise cfg
        tiers = _tiers(settings.cluster_profile)
        if cfg.training.priority not in tiers:  # what render and `pipelines check` say
            why = unknown_tier_message(cfg.training.priority, tiers)
            raise ConfigError(f"{path}: training.priority: {why}")
        return build_dag(cfg, settings)
    except ConfigError as e:
        log.error("%s", e)
        return broken_dag(path, e)
    except Exception as e:  # a bug or a library's refusal: this pipeline's, not the file's
        log.exception("%s: building its DAG failed", path)
        return broken_dag(path, e)


def _parse(path: Path) -> PipelineConfig | ConfigError:
    try:
        return parse_pipeline(path)
    except ConfigError as e:
        return e
    except Exception as e:  # one file's problem, shown on its stand-in DAG
        return ConfigError(f"{path}: cannot load the pipeline config: {e!r}")


def build_dags(
    pipelines_dir: Path | None = None, dag_id: str | None = None, task_id: str | None = None
) -> dict[str, DAG]:
    """Build one DAG per pipeline YAML file, in sorted order; each loads or fails alone.

    A name two pipelines claim (:func:`~trainyard.pipelines.name_owners`) breaks only the
    DAG of the one that does not own it, and a working pipeline's DAG id is never taken
    by a broken file's (that one gets a suffix).

    Given a ``dag_id`` (Airflow's parsing context: a worker starting a task, ``airflow
    tasks test``, ``airflow dags test``), only that DAG is built, from its file alone
    (:func:`task_dags`) when the folder's file names show which file it is; otherwise all
    are built to decide it, and that one DAG is returned.

    Args:
        pipelines_dir: Folder of pipeline configs (defaults to the settings').
        dag_id: Build only this DAG (``get_parsing_context().dag_id``); None builds all.
        task_id: The task about to run (``get_parsing_context().task_id``), if known.

    Returns:
        DAGs keyed by dag_id (a :func:`broken_dag` for each config that does not load).
    """
    settings = get_settings()
    files = pipeline_files(pipelines_dir or settings.pipelines_dir)
    if dag_id is not None:
        one = task_dags(files, dag_id, task_id, settings)
        if one is not None:
            return one
    parsed = {path: _parse(path) for path in files}
    owners = name_owners([c for c in parsed.values() if isinstance(c, PipelineConfig)])
    built: dict[Path, DAG] = {}
    for path, cfg in parsed.items():
        if isinstance(cfg, PipelineConfig) and (clashes := name_clashes(cfg, owners)):
            cfg = ConfigError("\n".join(f"{path}: {'.'.join(k)}: {why}" for k, why in clashes))
        built[path] = _pipeline_dag(path, cfg, settings)
    working = {d.dag_id: p for p, d in built.items() if "invalid-config" not in d.tags}
    dags: dict[str, DAG] = {}
    for path, dag in built.items():
        owner = working.get(dag.dag_id, path)
        if owner != path or dag.dag_id in dags:
            why = ConfigError(f"{path}: its DAG id {dag.dag_id} is {owner.name}'s")
            dag = broken_dag(path, why, dag_id=suffixed_dag_id(path))
        dags[dag.dag_id] = dag
    if dag_id is not None:  # built whole to decide it; still the one DAG asked for
        return {dag_id: dags[dag_id]} if dag_id in dags else {}
    return dags


def task_dags(
    files: Sequence[Path], dag_id: str, task_id: str | None, settings: Settings
) -> dict[str, DAG] | None:
    """The DAG a task runs, built from its own file alone; None when that cannot be told.

    A task's parse (Airflow sets the parsing context) needs one DAG, and building all of
    them made every task start pay for every pipeline. Which file a DAG id comes from is
    told by the file names alone (:func:`stem_dag_id`): nothing else is read but that one
    file (and the cluster profile's tiers, as for every DAG). What the full build decides
    from all the files, this answers so:

    * a broken file's stand-in: the same (its own errors are its file's);
    * DAG id ownership: when another file's name gives the same id, or the id is a
      suffixed stand-in's, None (the full build decides);
    * names two pipelines claim (serving model, streams): not checked here, as it needs
      every file. A run starts only from the DAG the dag-processor stored, which checked
      them: a refused pipeline's stand-in has one task, ``invalid_config``, and a task
      this DAG lacks gets None (the full build, the same stand-in). A run started from an
      older stored DAG, or ``dags test`` (no task named), builds the pipeline as its file
      says; its deploy and scorer still refuse a name another pipeline owns
      (:func:`trainyard.pipelines.ensure_own_names`).

    Args:
        files: The pipeline files (sorted).
        dag_id: The DAG id of the parsing context.
        task_id: Its task, if the context names one.
        settings: Locations (the Assets name them).

    Returns:
        ``{dag_id: DAG}``, ``{}`` if no file gives this id, or None to build them all.
    """
    claimants = [p for p in files if stem_dag_id(p) == dag_id]
    if any(suffixed_dag_id(p) == dag_id for p in files) or len(claimants) > 1:
        return None
    if not claimants:
        return {}
    (path,) = claimants
    dag = _pipeline_dag(path, _parse(path), settings)
    if task_id is not None and task_id not in dag.task_dict:
        return None
    return {dag.dag_id: dag}
