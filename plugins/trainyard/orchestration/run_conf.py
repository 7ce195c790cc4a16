"""What a run's conf and its backfill decide, alike on both runners.

The trigger form's overrides, a forced promotion's reason, a dry run, a forced retrain,
and the pipeline's backfill policy (:func:`should_train`) are read here once: the
``stage`` task refuses a conf no later step would take, and the ``train`` task decides
whether this run trains, or reuses the version trained on the same inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainyard.config import PipelineConfig, TrainingConfig
from trainyard.errors import ConfigError
from trainyard.registry import MAX_REASON_CHARS
from trainyard.steps import should_train

log = logging.getLogger("trainyard.orchestration")


FORM_OVERRIDES = ("epochs", "workers", "strategy", "priority")
"""The trigger form's training fields; nothing else of a run's conf reaches training."""


def _overrides(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: params.get(k) for k in FORM_OVERRIDES if k in params}


def run_training_params(cfg: PipelineConfig, params: Mapping[str, Any]) -> TrainingConfig:
    """A run's effective training config: the trigger form's values over the pipeline's.

    Both runners train with it: the local ``train`` task hands the same overrides to
    ``steps.train``, the kubernetes runner renders the run's Service and Jobs from it.

    Args:
        cfg: The pipeline config.
        params: The run's params (``context["params"]``).

    Returns:
        The validated training config of this run.
    """
    from trainyard.steps import training_params

    return training_params(cfg, _overrides(params))


def check_run_conf(cfg: PipelineConfig, context: Mapping[str, Any]) -> TrainingConfig:
    """Refuse a run's trigger form or conf that a later step would refuse.

    The stage task asks first thing, so a run with a typo fails before it stages
    anything, and the train task again (a task cleared alone).

    Returns:
        The run's effective training config (:func:`run_training_params`).

    Raises:
        AirflowFailException: Naming the problem: a conf key the form does not have,
            force promote without a reason (or one over
            :data:`trainyard.registry.MAX_REASON_CHARS`), an invalid training override.
    """
    params = context["params"]
    dag = context.get("dag")
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    known = set(getattr(dag, "params", None) or params)
    if unknown := sorted(set(conf) - known):
        raise AirflowFailException(
            f"unknown key(s) in the run's conf: {', '.join(map(repr, unknown))} (the trigger "
            f"form's: {', '.join(sorted(known))})"
        )
    reason = (params.get("force_reason") or "").strip()
    if params.get("force_promote") and not reason:
        raise AirflowFailException(
            "force promote needs a reason (the form's 'Reason for forcing'); refused "
            "before anything ran"
        )
    if len(reason) > MAX_REASON_CHARS:
        raise AirflowFailException(
            f"the reason for forcing has {len(reason)} characters (at most "
            f"{MAX_REASON_CHARS}); link to anything longer"
        )
    try:
        return run_training_params(cfg, params)
    except ConfigError as e:
        raise AirflowFailException(str(e)) from None


def run_training_or_skip(
    cfg: PipelineConfig,
    context: Mapping[str, Any],
    decide: Callable[[TrainingConfig, bool], Mapping[str, Any]] | None = None,
    plan: Callable[[TrainingConfig], Sequence[str]] | None = None,
) -> tuple[TrainingConfig, dict[str, Any]]:
    """This run's training config and whether it trains, or a skip before anything trains.

    The one decision both runners take before training: the pipeline's backfill policy
    (:func:`should_train`), then the trigger form's dry run, which logs what would train
    and stops (before any process or API call), then whether a version was trained on the
    same inputs (the ``plan`` step, :func:`trainyard.steps.plan`: a local process, or a
    pod that reads the models volume; the form's ``force_retrain`` trains all the same).
    The ``train`` task asks first thing, before the local runner starts a worker or the
    kubernetes runner creates a Service or a Job: a run that reuses a version, or skips,
    creates neither.

    Args:
        cfg: The pipeline config.
        context: The task's context (``params``, ``dag_run``, ``ti``).
        decide: Runs the ``plan`` step for a config and ``force_retrain``; None: the run
            trains (no version is looked for).
        plan: The runner's training plan of a config, as log lines (a dry run logs them).

    Returns:
        The run's effective training config (:func:`run_training_params`) and the
        ``plan`` step's result (``fingerprint``, ``reused``: the version to reuse or
        None, ``decision``; empty without ``decide``).

    Raises:
        AirflowSkipException: If the backfill policy leaves this run out, or on a dry run.
    """
    dag_run, params = context["dag_run"], context["params"]
    queued = 0
    if dag_run.run_type == "backfill" and cfg.backfill_training == "last":
        queued = context["ti"].get_dr_count(dag_id=dag_run.dag_id, states=["queued"])
    train_now, why = should_train(cfg.backfill_training, dag_run.run_type, queued)
    if not train_now:
        raise AirflowSkipException(why)
    training = check_run_conf(cfg, context)
    if params.get("dry_run"):
        log.info("dry run: would train %s", training.model_dump_json())
        if plan is not None:
            log.info("training plan:\n%s", "\n".join(plan(training)))
        log.info(
            "a version trained on the same inputs would be reused instead (unless "
            "force_retrain): the run's plan step decides that"
        )
        raise AirflowSkipException("dry run: stopping before training")
    decided = dict(decide(training, bool(params.get("force_retrain")))) if decide else {}
    if decided.get("decision"):
        log.info("training: %s", decided["decision"])
    return training, decided
