"""``trigger.stream``: messages on a Redis stream start runs through Airflow's triggerer.

One ``airflow standalone`` (scheduler, triggerer, API server) and the project's Redis
server. Two "new data" messages and a bad one are sent at once; the pipeline's
``AssetWatcher`` turns the good ones into Asset events, the scheduler starts runs, and
each announced day is staged by a run of its own (Airflow may hand both events to one
run, which stages the oldest and sends the other back to the stream). The bad message
starts nothing and is kept, with its reason, in ``<stream>.rejected``.
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest

from tests.support.harness import StandaloneEnv
from tests.support.scheduler import Scheduler

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# each test has a pipeline of its own, with its stream (tests/support/scheduler.py)
FIRST, PAUSED = "digits_stream", "digits_paused"


def _stage_interval(env: StandaloneEnv, dag: str, run_id: str) -> str:
    path = (
        f"/api/v2/dags/{dag}/dagRuns/{quote(run_id, safe='')}/taskInstances/stage/"
        "xcomEntries/return_value"
    )
    value = env.api(path)["value"]
    return (json.loads(value) if isinstance(value, str) else value)["interval_start"]


def test_messages_on_the_stream_start_a_run_per_announced_day(scheduler: Scheduler) -> None:
    import redis

    dag, stream = f"trainyard_{FIRST}", f"{FIRST}.arrivals"
    client = redis.Redis.from_url(scheduler.redis_url)
    try:
        env = scheduler.env()
        _unpause_and_wait_for_the_trigger(env, client, dag, stream, f"trainyard-trigger-{FIRST}")
        client.xadd(stream, {"ds": "2026-11-20"})
        client.xadd(stream, {"ds": "2026-11-32"})
        client.xadd(stream, {"ds": "2026-11-21"})

        end = time.monotonic() + 480
        while True:
            runs = env.api(f"/api/v2/dags/{dag}/dagRuns?limit=20")["dag_runs"]
            done = [r for r in runs if r["state"] in ("success", "failed")]
            if len(done) >= 2 and len(done) == len(runs):
                break
            assert time.monotonic() < end, [(r["dag_run_id"], r["state"]) for r in runs]
            time.sleep(1)
        assert {r["run_type"] for r in runs} == {"asset_triggered"}
        assert [r["state"] for r in runs] == ["success"] * len(runs)
        staged = sorted(_stage_interval(env, dag, r["dag_run_id"]) for r in runs)
        assert staged == ["2026-11-20", "2026-11-21"]
        rejected = client.xrange(f"{stream}.rejected")
        assert len(rejected) == 1
        assert rejected[0][1][b"reason"] == b"ds '2026-11-32' is not a date (YYYY-MM-DD)"
    finally:
        client.close()


def _groups(client: object, stream: str) -> list[dict]:
    try:
        return client.xinfo_groups(stream)  # type: ignore[attr-defined]
    except Exception:  # the stream does not exist before the trigger creates it
        return []


def _arrival_interval(env: StandaloneEnv, dag: str, run_id: str) -> str | None:
    """The day a run's ``arrivals`` task took (None: it took none, it skipped)."""
    base = f"/api/v2/dags/{dag}/dagRuns/{quote(run_id, safe='')}/taskInstances/arrivals"
    if env.api(base)["state"] != "success":
        return None
    value = env.api(f"{base}/xcomEntries/return_value")["value"]
    return (json.loads(value) if isinstance(value, str) else value)["interval_start"]


def test_messages_taken_while_the_dag_is_paused_start_their_runs_when_it_is_unpaused(
    scheduler: Scheduler,
) -> None:
    """Found by a new user: two messages sent just after ``airflow dags pause`` never ran.

    The triggerer runs a paused DAG's trigger until the dag-processor next parses its file.
    It took both messages; Airflow recorded their events but queues no run for a paused
    DAG, and the trigger had acknowledged them (pending 0): nothing ran after the unpause
    until an unrelated message came. Now a message stays pending until a run takes it and
    is handed over again: each day runs once after the unpause, and then nothing is pending.
    """
    import redis

    dag, stream = f"trainyard_{PAUSED}", f"{PAUSED}.arrivals"
    group = f"trainyard-trigger-{PAUSED}"
    client = redis.Redis.from_url(scheduler.redis_url)
    try:
        env = scheduler.env()
        _unpause_and_wait_for_the_trigger(env, client, dag, stream, group)

        # the user's steps: pause, two messages at once, unpause a few seconds later
        env.api(f"/api/v2/dags/{dag}", "PATCH", {"is_paused": True})
        sent = time.monotonic()
        client.xadd(stream, {"ds": "2026-11-19"})
        last = client.xadd(stream, {"ds": "2026-11-20"}).decode()
        # the trigger, still running, takes both (what the user saw)
        end = time.monotonic() + 60
        while (_group(client, stream, group) or {}).get("last-delivered-id") != last:
            assert time.monotonic() < end, ("never taken", _group(client, stream, group))
            time.sleep(0.2)
        time.sleep(max(0.0, sent + 8 - time.monotonic()))
        env.api(f"/api/v2/dags/{dag}", "PATCH", {"is_paused": False})

        # each day starts a run of its own (once), with no other message sent
        end = time.monotonic() + 300
        while True:
            runs = env.api(f"/api/v2/dags/{dag}/dagRuns?limit=20")["dag_runs"]
            done = [r for r in runs if r["state"] in ("success", "failed")]
            taken = [_arrival_interval(env, dag, r["dag_run_id"]) for r in done]
            if len([t for t in taken if t]) >= 2 and len(done) == len(runs):
                break
            assert time.monotonic() < end, [(r["dag_run_id"], r["state"]) for r in runs]
            time.sleep(1)
        assert [r["state"] for r in runs] == ["success"] * len(runs)
        assert sorted(t for t in taken if t) == ["2026-11-19", "2026-11-20"]
        # acknowledged by the runs that took them
        assert (_group(client, stream, group) or {}).get("pending") == 0
    finally:
        client.close()


def _unpause_and_wait_for_the_trigger(
    env: StandaloneEnv, client: object, dag: str, stream: str, group: str
) -> None:
    """Unpause the DAG once it is parsed; wait until the triggerer runs its stream trigger
    (the watcher's consumer group then exists)."""
    end = time.monotonic() + 240
    while env.get(f"/api/v2/dags/{dag}")[0] != 200:
        assert time.monotonic() < end, f"{dag} never appeared"
        time.sleep(1)
    env.api(f"/api/v2/dags/{dag}", "PATCH", {"is_paused": False})
    end = time.monotonic() + 300
    while _group(client, stream, group) is None:
        assert time.monotonic() < end, "the triggerer never started the stream trigger"
        time.sleep(1)


def _group(client: object, stream: str, name: str) -> dict | None:
    """The consumer group's ``XINFO GROUPS`` entry (names and ids decoded), if it exists."""
    for g in _groups(client, stream):
        g = {k: v.decode() if isinstance(v, bytes) else v for k, v in g.items()}
        if g.get("name") == name:
            return g
    return None
