"""Where a step task's argument values come from, declared in the graph, resolved at run.

A step's arguments (the step table's) are declared by source: a constant, another task's
result, a trigger-form field or a fact of the run. The operator resolves them from the
task's context when it runs, then renders the step's pod with those values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FromXCom:
    """A key of another task's result (``None`` when that task was skipped)."""

    task_id: str
    key: str


@dataclass(frozen=True)
class FromParam:
    """A field of the run's trigger form (``params``)."""

    name: str


@dataclass(frozen=True)
class FromRun:
    """A fact of the run.

    ``run_id``, ``interval_start``, ``interval_end``, ``actor``, or ``requested_snapshot``
    (the form's snapshot id, else the triggering Asset event's). ``schedule`` is the
    pipeline's, for the interval of a run that has none (:func:`run_interval`).
    """

    name: str
    schedule: str | None = None


@dataclass(frozen=True)
class Results:
    """The results of several tasks keyed by task id (skipped ones left out)."""

    task_ids: tuple[str, ...]


Source = Any
"""A constant, or one of the classes above."""


def run_interval(context: Mapping[str, Any], schedule: str | None = None) -> tuple[str, str]:
    """The run's data interval as dates.

    A run without one (triggered with no logical date) covers the latest interval of the
    pipeline's ``schedule`` complete when it runs (a day without a schedule), as
    ``trainyard run`` does: not the day still going on, whose partial data would make a
    champion no run of an earlier day could beat.
    """
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        from trainyard.steps import latest_interval

        start, end = latest_interval(schedule, context["dag_run"].run_after)
    return start.date().isoformat(), end.date().isoformat()


def triggering_snapshot(context: Mapping[str, Any]) -> str | None:
    """The snapshot id of the newest Asset event that triggered this run, if any."""
    events = context.get("triggering_asset_events") or {}
    newest = None
    for asset_events in events.values():
        for event in asset_events:
            if (event.extra or {}).get("snapshot_id") and (
                newest is None or event.timestamp > newest.timestamp
            ):
                newest = event
    return newest.extra["snapshot_id"] if newest else None


def actor(context: Mapping[str, Any]) -> str:
    """Who started the run: the triggering user, else ``airflow:<run type>``."""
    dag_run = context.get("dag_run")
    who = getattr(dag_run, "triggering_user_name", None) if dag_run else None
    kind = getattr(dag_run, "run_type", None) or "run"
    return who or f"airflow:{getattr(kind, 'value', kind)}"


def _run_fact(fact: FromRun, context: Mapping[str, Any]) -> Any:
    name = fact.name
    if name == "run_id":
        return context["run_id"]
    if name in ("interval_start", "interval_end"):
        return run_interval(context, fact.schedule)[0 if name == "interval_start" else 1]
    if name == "actor":
        return actor(context)
    if name == "requested_snapshot":
        return (context.get("params") or {}).get("snapshot_id") or triggering_snapshot(context)
    raise KeyError(f"unknown run fact {name!r}")


def resolve(source: Source, context: Mapping[str, Any]) -> Any:
    """The value of one source in a task's context.

    Args:
        source: A constant or a source object.
        context: The task's Airflow context.

    Returns:
        The value (``None`` for a skipped task's result).
    """
    if isinstance(source, FromXCom):
        result = context["ti"].xcom_pull(task_ids=source.task_id)
        return (result or {}).get(source.key)
    if isinstance(source, FromParam):
        return (context.get("params") or {}).get(source.name)
    if isinstance(source, FromRun):
        return _run_fact(source, context)
    if isinstance(source, Results):
        ti = context["ti"]
        done = _succeeded(ti, source.task_ids)
        pulled = {t: ti.xcom_pull(task_ids=t) for t in source.task_ids if t in done}
        return {t: v for t, v in pulled.items() if v}
    return source


def _succeeded(ti: Any, task_ids: tuple[str, ...]) -> set[str]:
    """Which of ``task_ids`` succeeded in the task's run.

    A run cleared and run again keeps the results of tasks that then skip without
    starting (``register`` after a skipped ``train``): their result is an earlier try's.
    """
    states = ti.get_task_states(dag_id=ti.dag_id, task_ids=list(task_ids), run_ids=[ti.run_id])
    run = states.get(ti.run_id) or {}
    return {t for t in task_ids if run.get(t) == "success"}


def resolve_all(inputs: Mapping[str, Source], context: Mapping[str, Any]) -> dict[str, Any]:
    """Every input of a step task resolved in its context."""
    return {name: resolve(src, context) for name, src in inputs.items()}
