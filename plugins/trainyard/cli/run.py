"""``python -m trainyard run``: a pipeline's steps in this process, without Airflow.

Each interval runs the steps of the step table in the graph's order, and every decision is
the one the DAG takes, made by the same code: which runs of a range train
(:func:`trainyard.steps.should_train`, as in a backfill), whether a version may ship
without a person's approval (the ``deploy`` step's own check), what a failed day does to
the range (it fails alone).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

from trainyard import argtypes
from trainyard.config import load_pipeline
from trainyard.errors import (
    INTERRUPTED,
    ApprovalMissing,
    ConfigError,
    DaysFailed,
    SnapshotError,
    StagingError,
    StepSkipped,
    ValidationFailed,
)
from trainyard.runs import format_summary, record_failure
from trainyard.serving.status import server_answer
from trainyard.settings import get_settings
from trainyard.steps import (
    EXIT_DETERMINISTIC,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIPPED,
    Arg,
    _remove_run_folder,
    _report_error,
    data_intervals,
    deploy,
    evaluate,
    overrides_object,
    should_train,
    stage,
    summary,
    train,
    training_params,
    validate,
)

log = logging.getLogger("trainyard.steps")


RUN_FORCE_KEYS = frozenset({"force_promote", "force_reason"})
"""``trainyard run --overrides`` keys that force the gate, not training parameters."""


def _training_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """The training parameters among ``trainyard run --overrides`` (no :data:`RUN_FORCE_KEYS`)."""
    return {k: v for k, v in overrides.items() if k not in RUN_FORCE_KEYS}


def _days_text(days: dict[str, str]) -> str:
    """``day: why; day: why`` for the days a ``trainyard run`` range skipped or failed."""
    return "; ".join(f"{day}: {why}" for day, why in days.items())


def run_all(
    pipeline: str,
    overrides: dict[str, Any] | None = None,
    intervals: list[tuple[str, str]] | None = None,
    force_retrain: bool = False,
) -> dict[str, Any]:
    """Run every step in this process, in order, without Airflow (``trainyard run``).

    Each interval is staged and validated as its DAG run would; as in a backfill, which of
    them train follows the pipeline's ``backfill_training`` (``last``: the final one, on
    its training window).

    Args:
        pipeline: Pipeline name.
        overrides: Training overrides and ``force_promote`` / ``force_reason``.
        intervals: ``(start, end)`` data intervals (:func:`data_intervals`); None: the
            latest complete one.
        force_retrain: Train even if a version was trained on the same inputs (else it
            is reused, and gated again).

    Returns:
        The run summary of the last interval that was not skipped; ``skipped`` lists the
        days skipped (``source.when_missing: skip``, logged with why), if any.

    Raises:
        StepSkipped: If every interval was skipped.
    """
    from trainyard.registry import caller

    overrides = overrides_object(overrides)
    if overrides.get("force_promote") and not overrides.get("force_reason"):
        raise ConfigError("force_promote needs a force_reason (recorded with who and when)")
    training = _training_overrides(overrides)
    cfg = load_pipeline(pipeline)
    training_params(cfg, training)  # refuse bad overrides before staging
    intervals = intervals or data_intervals(cfg)
    # two runs started in the same second must not share a run id (and its work folders)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    record: dict[str, Any] = {}
    skipped: dict[str, str] = {}  # day: why
    rejected: dict[str, str] = {}  # day: the error (bad data: no retry fixes it)
    run_id = ""  # the run an interrupt stops, and its results so far
    results: dict[str, Any] = {}
    try:
        for i, (start, end) in enumerate(intervals):
            start, end = start[:10], end[:10]  # as the DAG's steps get them (run_interval): days
            run_type = "backfill" if len(intervals) > 1 else "manual"
            trains, why = should_train(cfg.backfill_training, run_type, len(intervals) - 1 - i)
            last = i == len(intervals) - 1
            run_id = f"cli__{start[:10]}__{stamp}"
            results = {}
            try:
                results["stage"] = stage(pipeline, start, end)
                snap = results["stage"]["snapshot_id"]
                results["validate"] = validate(pipeline, snap, start)
            except StepSkipped as e:
                skipped[start] = str(e)
                # as its DAG run: this day's tasks skip, the range goes on
                log.warning("%s: skipped: %s", start, e)
                continue
            except (StagingError, SnapshotError, ValidationFailed) as e:
                if len(intervals) == 1:
                    raise
                # as its DAG run: this day fails alone (a backfill's run fails alone whatever
                # its staging error, once its retries are spent), the range goes on
                rejected[start] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                log.error("%s: failed: %s", start, e)
                continue
            if not trains:
                log.info("%s: %s", start, why)
            if trains:
                window = results["validate"]["window"]
                try:
                    results["train"] = train(
                        pipeline, snap, run_id, training, window=window, force_retrain=force_retrain
                    )
                except BaseException:
                    # nothing resumes a run of this command (its run id is new each time):
                    # its checkpoints would only fill the volume
                    folder = _remove_run_folder(cfg, run_id)
                    log.info("removed the checkpoints of run %s (%s)", run_id, folder)
                    raise
                version = results["train"]["version"]
                results["evaluate"] = evaluate(
                    pipeline,
                    version,
                    bool(overrides.get("force_promote")),
                    overrides.get("force_reason"),
                    caller(),
                )
                if results["evaluate"]["promote"]:
                    try:
                        results["deploy"] = deploy(pipeline, version, caller())
                    except ApprovalMissing as e:  # the deploy step's own check, as in the DAG
                        log.warning(
                            "%s; then python -m trainyard deploy --pipeline %s --version %s",
                            e,
                            pipeline,
                            version,
                        )
            record = summary(pipeline, run_id, results, log_it=not last)  # the CLI prints the last
    except KeyboardInterrupt:  # Ctrl-C: this run stops, its reason recorded, no retry
        if run_id:
            order = ("stage", "validate", "train", "evaluate", "deploy", "summary")
            step = next((n for n in order if n not in results), "summary")
            record_failure(cfg.name, run_id, step, f"{INTERRUPTED} (during {step})")
        raise
    if rejected and (not record or rejected.get(intervals[-1][0][:10])):
        raise DaysFailed(
            f"{len(rejected)} day(s) failed on their data, nothing trained: {_days_text(rejected)}"
        )
    if not record:
        raise StepSkipped(_days_text(skipped))
    if skipped:
        record["skipped"] = list(skipped)
    if rejected:
        record["failed_days"] = rejected
    return record


@contextlib.contextmanager
def the_only_run(pipeline: str, what: str) -> Iterator[str | None]:
    """Hold ``_models/<pipeline>/.run.lock`` for a run from this machine, or say who holds it.

    ``trainyard run`` and ``make run`` (:mod:`trainyard.orchestration.dagtest`) take it:
    two runs of one pipeline at once both trained, and the second's deploy was then
    refused (gated against a champion that had changed): its training was wasted. The
    scheduler's runs are one at a time already (``max_active_runs=1``).

    Args:
        pipeline: The pipeline.
        what: What runs, as the refusal of a second one names it (``trainyard run``).

    Yields:
        None if the lock is held, else who holds it (``make run, pid N since T, log L``).
    """
    import fcntl

    from trainyard.layout import Layout

    folder = Layout(get_settings().volume_root).models(pipeline)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield os.pread(fd, 500, 0).decode("utf-8", "replace").strip() or "another process"
            return
        since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, what.format(pid=os.getpid(), since=since).encode(), 0)
        yield None
    finally:
        os.close(fd)


def registry_state(pipeline: str) -> tuple[list[int], int | None]:
    """The registered versions and the champion, to tell what a stopped run left behind."""
    from trainyard.errors import TrainyardError
    from trainyard.registry import Registry

    registry = Registry(get_settings().models_root, pipeline)
    try:
        return registry.list_versions(), registry.champion()
    except TrainyardError:
        return registry.list_versions(), None


def interrupted_line(pipeline: str, before: tuple[list[int], int | None]) -> str:
    """What an interrupted run left, compared with the registry before it started."""
    versions, champion = registry_state(pipeline)
    new = [v for v in versions if v not in before[0]]
    if champion != before[1]:
        return f"version {champion} was deployed before the interrupt"
    if new:
        return f"version {new[-1]} was registered before the interrupt, nothing was deployed"
    return "nothing was registered or deployed"


def run_cli_main(argv: list[str]) -> int:
    """``python -m trainyard run --pipeline P [--ds DAY [--end-ds DAY]] [--overrides JSON]``."""
    p = argtypes.ArgumentParser(
        prog="python -m trainyard run",
        description="Run every step of a pipeline without Airflow, for the data intervals "
        "its DAG runs would have: the latest complete one, those starting on --ds, or on "
        "each day from --ds to --end-ds (a backfill: which runs train follows "
        "backfill_training).",
    )
    p.add_argument("--pipeline", required=True)
    p.add_argument("--ds", type=argtypes.day, help="interval day (YYYY-MM-DD)")
    p.add_argument("--end-ds", type=argtypes.day, help="last day of a range (YYYY-MM-DD)")
    p.add_argument("--overrides", type=Arg("overrides", "json").parse, default={})
    p.add_argument(
        "--force-retrain",
        action="store_true",
        help="train even if a version was trained on the same inputs (snapshots, config, "
        "seed, code, image); without it that version is reused and gated again",
    )
    args = p.parse_args(argv)
    if args.end_ds and not args.ds:
        p.error("--end-ds needs --ds")
    try:
        overrides_object(args.overrides)
    except ConfigError as e:
        p.error(f"--{e}")
    try:
        cfg = load_pipeline(args.pipeline)
    except ConfigError as e:  # an unknown pipeline or a config that cannot run, as for a step
        _report_error(f"trainyard run: {type(e).__name__}: {e}")
        return EXIT_DETERMINISTIC
    try:
        intervals = data_intervals(cfg, args.ds, args.end_ds) if args.ds else None
    except ConfigError as e:
        p.error(str(e))
    try:
        # an unknown or ill-typed option: a usage error
        training_params(cfg, _training_overrides(args.overrides))
    except ConfigError as e:
        p.error(f"--overrides: {e}")
    with the_only_run(cfg.name, "`trainyard run`, pid {pid} since {since}") as holder:
        if holder is not None:
            _report_error(
                f"trainyard run: pipeline {cfg.name!r} is being run already ({holder}): wait "
                "for it to end; nothing was run"
            )
            return EXIT_FAILED
        before = registry_state(cfg.name)
        try:
            record = run_all(args.pipeline, args.overrides, intervals, args.force_retrain)
        except StepSkipped as e:
            _report_error(f"trainyard run: skipped: {e}")
            return EXIT_SKIPPED
        except KeyboardInterrupt:
            _report_error(
                f"trainyard run: {INTERRUPTED}: the run stopped, its workers too; "
                f"{interrupted_line(cfg.name, before)}"
            )
            return EXIT_INTERRUPTED
    sys.stdout.write(format_summary(record, server_answer(cfg.name)) + "\n")
    if record.get("failed_days"):  # the range went on without them, as a backfill does
        failed = record["failed_days"]
        _report_error(f"trainyard run: {len(failed)} day(s) failed: {_days_text(failed)}")
        return EXIT_DETERMINISTIC
    return EXIT_OK
