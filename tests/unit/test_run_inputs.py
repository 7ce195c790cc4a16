"""What a step task reads of its run: the data interval and who started it."""

from __future__ import annotations

import datetime as dt
import os
from types import SimpleNamespace

import pytest
from airflow.utils.types import DagRunType

from trainyard.orchestration.inputs import actor, run_interval

AFTER = dt.datetime(2026, 11, 27, 2, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("30 1 * * *", ("2026-11-26", "2026-11-27")),  # 01:30 to 01:30, complete at 02:00
        ("0 3 * * *", ("2026-11-25", "2026-11-26")),  # today's 03:00 has not come yet
        (None, ("2026-11-26", "2026-11-27")),  # no schedule: the last complete day
    ],
)
def test_a_run_without_a_data_interval_covers_the_latest_complete_one(
    schedule: str | None, expected: tuple[str, str]
) -> None:
    """Found by a cold user: a run triggered with no logical date staged today's partial
    day (start and end today) and its model became a champion no backfill could beat."""
    context = {"dag_run": SimpleNamespace(run_after=AFTER)}
    assert run_interval(context, schedule) == expected


def test_a_run_with_a_data_interval_covers_it() -> None:
    start = dt.datetime(2026, 11, 1, 1, 30, tzinfo=dt.UTC)
    context = {
        "data_interval_start": start,
        "data_interval_end": start + dt.timedelta(days=1),
        "dag_run": SimpleNamespace(run_after=AFTER),
    }
    assert run_interval(context, "30 1 * * *") == ("2026-11-01", "2026-11-02")


def test_the_actor_of_a_scheduled_run_names_its_type() -> None:
    """Found by a cold user: promotions by a scheduled run were recorded as
    ``airflow:DagRunType.SCHEDULED``."""
    run = SimpleNamespace(triggering_user_name=None, run_type=DagRunType.SCHEDULED)
    assert actor({"dag_run": run}) == "airflow:scheduled"
    run = SimpleNamespace(triggering_user_name="ada", run_type=DagRunType.MANUAL)
    assert actor({"dag_run": run}) == "ada"


def test_a_step_run_by_hand_without_user_records_the_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a cold user: with ``USER`` and ``LOGNAME`` unset (containers, cron), steps
    run by hand recorded ``cli`` as the actor, not the login name the README promises."""
    import pwd

    from trainyard.registry import caller

    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    assert caller() == pwd.getpwuid(os.getuid()).pw_name
    monkeypatch.setenv("LOGNAME", "grace")
    assert caller() == "grace"
    monkeypatch.setenv("USER", "ada")
    assert caller() == "ada"
