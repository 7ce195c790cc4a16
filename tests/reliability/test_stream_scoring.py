"""Stream scoring end to end: real Redis, a real model server process, real scorer processes.

10,000 records (every 50th breaks the contract) go to the input stream; a scorer is
SIGKILLed mid-way and a second one claims what it left pending; the champion is promoted
while the second one runs. Every valid record must have exactly one score keyed by its
id, computed by the version written with it, every invalid one a dead letter with its
reason, and nothing may be left pending. Then the Redis server itself is SIGKILLed under
a supervised scorer.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.support.ports import free_port
from tests.support.streams import CONTRACT, SPEC, build_models, make_records, write_project
from trainyard.fsutil import process_alive
from trainyard.serving import model_config
from trainyard.serving.client import ServingClient
from trainyard.serving.deploy import ensure_local_server, publish_version, stop_local_server
from trainyard.streaming import redis_server
from trainyard.streaming.engines import Message, Output, RedisStreams, StreamError, Streams

N = 10_000
FIRST = 5_000
STREAMS = Streams("events.in", "events.scores", "events.dead", "trainyard-events")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("stream")
    port = free_port()
    env = write_project(root, port, batch_size=128, max_in_flight=2, claim_idle_s=2.0)
    gt, lt = build_models(root / "models")
    serving = root / "volumes" / "_serving"
    publish_version(gt, serving, "events", 1, SPEC)
    publish_version(lt, serving, "events", 2, SPEC)
    model_config.set_served(serving, "events", [1], {model_config.STABLE: 1})
    try:  # a server started before a failure here is stopped too
        ensure_local_server(serving, "127.0.0.1", port)
        url = redis_server.ensure_running(root / "redis")
        yield {"root": root, "env": {**os.environ, **env}, "port": port, "url": url}
    finally:
        # scorers first: a supervised scorer would start the project's Redis again
        from unittest import mock

        from trainyard.streaming.local_scorer import stop_all_local_scorers

        with mock.patch.dict(os.environ, env):
            stop_all_local_scorers()
        stop_local_server(serving)
        redis_server.stop(root / "redis")


def _scorer(project, name: str) -> subprocess.Popen[bytes]:
    log = open(project["root"] / f"scorer-{name}.log", "wb")  # noqa: SIM115 - closed by the OS
    return subprocess.Popen(
        [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
         "--consumer", name, "--report-s", "0.5",
         "--status-file", str(project["root"] / f"status-{name}.json")],
        env=project["env"], stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _entries(r, stream: str) -> list[dict]:
    return [orjson.loads(f[b"value"]) for _, f in r.xrange(stream)]


def _wait(predicate, timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def _stable(port: int) -> tuple[int | None, bool]:
    """The stable label's version, and whether version 1 is still loaded."""
    with ServingClient("127.0.0.1", port) as c:
        label = None
        status, data = c.request("GET", "/v1/models/events/labels/stable/metadata")
        if status == 200:
            label = int(orjson.loads(data)["model_spec"]["version"])
        status, data = c.request("GET", "/v1/models/events")
        loaded = status == 200 and any(
            e["version"] == "1" and e["state"] == "AVAILABLE"
            for e in orjson.loads(data)["model_version_status"]
        )
    return label, loaded


def test_kill_restart_and_promotion_score_every_record_once(project) -> None:
    engine = RedisStreams(project["url"], STREAMS, consumer="test-producer")
    r = engine.r
    records, bad = make_records(N, bad_every=50)
    engine.produce([(None, v) for v in records[:FIRST]])

    # the first scorer is killed mid-way: whatever it read and did not commit stays pending
    a = _scorer(project, "a")
    _wait(
        lambda: (
            r.xlen(STREAMS.output) >= 1000
            and r.xpending(STREAMS.input, STREAMS.group)["pending"] > 0
        ),
        90,
        "scorer a's first scores, with a batch read and not yet committed",
        poll=0.002,
    )
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    left = r.xpending(STREAMS.input, STREAMS.group)["pending"]
    done_by_a = r.xlen(STREAMS.output) + r.xlen(STREAMS.dead_letter)
    assert done_by_a < FIRST, "scorer a finished before it was killed: nothing to resume"

    # its replacement claims the pending entries once they are idle (claim_idle_s: 2)
    b = _scorer(project, "b")
    try:
        _wait(
            lambda: r.xlen(STREAMS.output) + r.xlen(STREAMS.dead_letter) >= FIRST,
            60,
            "the first 5,000 records",
        )
        # promotion during the run: the model config now serves version 2 alone
        engine.produce([(None, v) for v in records[FIRST : FIRST + 2500]])
        model_config.set_served(
            project["root"] / "volumes" / "_serving", "events", [2], {model_config.STABLE: 2}
        )
        _wait(lambda: _stable(project["port"]) == (2, False), 60, "version 2 served alone")
        engine.produce([(None, v) for v in records[FIRST + 2500 :]])
        _wait(
            lambda: (
                r.xlen(STREAMS.output) + r.xlen(STREAMS.dead_letter) >= N
                and r.xpending(STREAMS.input, STREAMS.group)["pending"] == 0
            ),
            60,
            "every record",
        )
        time.sleep(0.5)  # anything written twice would show now
    finally:
        b.send_signal(signal.SIGTERM)
        assert b.wait(30) == 0
    b_status = orjson.loads((project["root"] / "status-b.json").read_bytes())

    scores = _entries(r, STREAMS.output)
    dead = _entries(r, STREAMS.dead_letter)
    valid = {f"ev-{i}" for i in range(N)} - bad
    by_id = collections.defaultdict(list)
    for s in scores:
        by_id[s["id"]].append(s)
    # duplicates would be recognisable by id (and by source: the same input entry twice)
    duplicates = {k: v for k, v in by_id.items() if len(v) > 1}
    assert duplicates == {}, f"{len(duplicates)} records scored twice"
    assert set(by_id) == valid
    assert len(scores) == len(valid) == N - len(bad)

    # every invalid record is a dead letter with its reason, none is scored
    assert {d["id"] for d in dead} == bad and len(dead) == len(bad)
    reasons = collections.Counter(d["reason"].split(":")[0] for d in dead)
    assert set(reasons) == {"a", "b", "label", "colour"}, reasons
    assert all(d["reason"] and d["source"] and d["value"] for d in dead)

    # the kill: a's pending entries were claimed by b
    assert left > 0 and b_status["claimed"] >= left
    assert r.xpending(STREAMS.input, STREAMS.group)["pending"] == 0

    # the version written with each score is the one that computed it: version 1 says
    # class 1 when a > b, version 2 when a < b
    values = {orjson.loads(v)["id"]: orjson.loads(v) for v in records}
    for s in scores:
        rec = values[s["id"]]
        want = int(rec["a"] > rec["b"]) if s["version"] == 1 else int(rec["a"] < rec["b"])
        assert s["class_id"] == want, s
    index = {s["id"]: int(s["id"].split("-")[1]) for s in scores}
    v_of = {s["id"]: s["version"] for s in scores}
    assert {v_of[k] for k, i in index.items() if i < FIRST} == {1}
    assert {v_of[k] for k, i in index.items() if i >= FIRST + 2500} == {2}
    assert b_status["version"] == 2 and b_status["lag"] == 0


def test_scorer_waits_for_a_server_that_is_down(project, tmp_path: Path) -> None:
    """Back-pressure: with no server the scorer reads one window of batches and waits."""
    env, streams = _down_project(project, tmp_path, "down")
    engine = RedisStreams(project["url"], streams, consumer="test-producer")
    records, _ = make_records(2000, seed=5)
    engine.produce([(None, v) for v in records])
    status = tmp_path / "status.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
         "--report-s", "0.3", "--status-file", str(status)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait(
            lambda: status.is_file() and orjson.loads(status.read_bytes())["server"] != "ok",
            60,
            "the scorer to report the server down",
        )
        time.sleep(1.5)
        doc = orjson.loads(status.read_bytes())
        # at most 2 * max_in_flight + 1 (5) batches of 128 read; the rest waits in the stream
        assert doc["read"] <= 5 * 128 and doc["scored"] == 0
        assert doc["lag"] >= 2000 - 5 * 128
        assert "ConnectionRefusedError" in doc["server"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()[-2000:]
    assert engine.r.xlen("down.scores") == 0
    assert engine.r.xpending("down.in", "trainyard-events")["pending"] == doc["read"]


def _down_project(project, tmp_path: Path, prefix: str) -> tuple[dict, Streams]:
    """The events pipeline on streams ``<prefix>.*`` with its model server's port unused."""
    env = dict(project["env"])
    pipelines = Path(env["TRAINYARD_PIPELINES_DIR"])
    down = tmp_path / "pipelines"
    down.mkdir()
    text = (pipelines / "events.yaml").read_text()
    text = text.replace(f"port: {project['port']}", f"port: {free_port()}")
    (down / "events.yaml").write_text(text.replace("events.", f"{prefix}."))
    env["TRAINYARD_PIPELINES_DIR"] = str(down)
    return env, Streams(f"{prefix}.in", f"{prefix}.scores", f"{prefix}.dead", "trainyard-events")


def test_exit_when_idle_gives_up_on_a_server_that_stays_down(project, tmp_path: Path) -> None:
    """Found by a new user: ``--exit-when-idle 3`` with the model server down and records
    waiting never exited (it retried until killed), and the line it printed when stopped
    said "0 batches in flight (left pending)" right before "pending 10"."""
    env, streams = _down_project(project, tmp_path, "idle")
    engine = RedisStreams(project["url"], streams, consumer="test-producer")
    engine.r.delete(streams.input, streams.output, streams.dead_letter)
    records, _ = make_records(10, seed=17)
    engine.produce([(None, v) for v in records])
    status = tmp_path / "status.json"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
         "--exit-when-idle", "2", "--report-s", "0.5", "--status-file", str(status)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # the old scorer: retrying for ever
            proc.kill()
            proc.wait()
    text = out.decode()
    try:
        assert time.monotonic() - started < 45, text[-3000:]
        assert proc.returncode == 1, text[-3000:]  # documented: gave up, records left
        assert "nothing read or scored for 2 s (--exit-when-idle)" in text, text[-3000:]
        assert "ConnectionRefusedError" in text and "Traceback" not in text, text[-3000:]
        assert "0 batches" not in text, text[-3000:]
        # the last lines agree: the 10 records read stay pending, and the group says so
        left, last = text.strip().splitlines()[-2:]
        assert left.endswith(
            "stopped with 10 records read and not committed (in 1 batch): they stay "
            "pending in the group for the next scorer to claim"
        ), text[-3000:]
        assert "scored 0 " in last and "pending 10," in last, last
        doc = orjson.loads(status.read_bytes())
        assert doc["state"] == "failed" and "--exit-when-idle" in doc["error"], doc
        assert doc["pending"] == 10 and doc["scored"] == 0 and doc["read"] == 10, doc
        assert engine.r.xpending(streams.input, streams.group)["pending"] == 10
        assert engine.r.xlen(streams.output) == 0
    finally:
        engine.r.delete(streams.input, streams.output, streams.dead_letter)
        engine.close()


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: an orphan's new parent may not reap it at once)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_scorer_whose_supervisor_is_killed_says_it_failed(project, tmp_path: Path) -> None:
    """Found by a new user: ``kill -9`` of the supervisor made its scorer exit (its parent-
    death signal is SIGTERM) with ``state: stopped, error: null``, as after ``make stop``."""
    import psutil

    status = tmp_path / "status.json"
    sup = subprocess.Popen(
        [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
         "--consumer", "orphan", "--supervise", "--report-s", "0.5",
         "--status-file", str(status)],
        env=project["env"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    child = None
    try:
        _wait(lambda: status.is_file(), 60, "the supervised scorer's status")
        doc = orjson.loads(status.read_bytes())
        child = doc["pid"]  # the scorer, not its supervisor
        assert doc["state"] == "running" and psutil.Process(child).ppid() == sup.pid, doc
        sup.send_signal(signal.SIGKILL)
        sup.wait(10)
        _wait(lambda: _gone(child), 30, "the scorer to exit")
    finally:
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    doc = orjson.loads(status.read_bytes())
    assert doc["state"] == "failed", doc
    assert doc["error"].startswith(f"its supervisor (pid {sup.pid}) died"), doc
    assert doc["last_failure"] == doc["error"]


def test_deploy_step_rolls_a_supervised_scorer_and_make_stop_stops_it(
    project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy step's ``roll_scorer``: a detached supervised process with pid/log/status."""
    from trainyard import steps
    from trainyard.config import load_pipeline
    from trainyard.streaming import local_scorer as scoring
    from trainyard.streaming.score_stream import model_unreachable

    for k, v in project["env"].items():
        if k.startswith("TRAINYARD_"):
            monkeypatch.setenv(k, v)
    cfg = load_pipeline("events")
    folder = scoring.scorer_dir("events")
    status_file = folder / scoring.STATUS_FILE
    line = steps.roll_scorer(cfg, local=True)
    first = scoring.local_scorer_pid("events")
    assert first and (folder / scoring.LOG_FILE).is_file()
    # found by a new user: the line named the supervisor's pid, status.json its child's
    status = orjson.loads(status_file.read_bytes())
    assert status["supervisor_pid"] == first and status["pid"] != first
    assert line == (
        f"scorer running (supervisor pid {first}, scorer pid {status['pid']}) on redis events.in"
    )

    def children(pid: int) -> list[int]:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(c) for c in text.split()]

    _wait(lambda: len(children(first)) == 1, 30, "the supervised scorer")
    _wait(lambda: model_unreachable(cfg) is None, 120, "the model", poll=0.5)
    # a restart by hand (after a contract change) does what the next deploy would
    out = subprocess.run(
        [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events", "--restart"],
        env=project["env"], capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    second = scoring.local_scorer_pid("events")
    status = orjson.loads(status_file.read_bytes())
    assert status["supervisor_pid"] == second
    assert out.stdout.startswith(
        f"scorer running (supervisor pid {second}, scorer pid {status['pid']}); log "
    )
    assert "warning" not in out.stderr, out.stderr  # its model server answers
    # a contract the new scorer could not load: refused, and the running one left alone
    contract = project["root"] / "contracts" / "events.yaml"
    good = contract.read_text()
    contract.write_text(good.replace('"^ev-[0-9]+$"', '"(("'))
    try:
        out = subprocess.run(
            [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
             "--restart"],
            env=project["env"], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        contract.write_text(good)
    assert out.returncode == 3 and "invalid regular expression" in out.stderr, out.stderr
    assert scoring.local_scorer_pid("events") == second
    assert second and second != first and not process_alive(first)
    _wait(lambda: len(children(second)) == 1, 30, "the supervised scorer")
    # a scorer that dies is started again by its supervisor, and scores
    (child,) = children(second)
    os.kill(child, signal.SIGKILL)
    _wait(lambda: children(second) not in ([], [child]), 30, "a restarted scorer")
    engine = RedisStreams(project["url"], STREAMS, consumer="test-producer")
    before = engine.r.xlen(STREAMS.output)
    records, _ = make_records(300, seed=9)
    engine.produce([(None, v) for v in records])
    _wait(lambda: engine.r.xlen(STREAMS.output) >= before + 300, 60, "scores")
    # the status file (every 5 s) says what runs: scored, lag, the version that scores
    _wait(lambda: orjson.loads(status_file.read_bytes()).get("scored", 0) >= 300, 30, "status")
    status = orjson.loads(status_file.read_bytes())
    assert status["state"] == "running" and status["lag"] == 0
    assert status["version"] == _stable(project["port"])[0]  # 2 after the first test's promotion
    # make stop
    (new_child,) = children(second)
    assert scoring.stop_all_local_scorers() == ["events"]
    assert not process_alive(second) and not process_alive(new_child)
    assert not (folder / scoring.PID_FILE).exists()
    status = orjson.loads(status_file.read_bytes())
    assert status["state"] == "stopped" and status["error"] is None, status  # asked to stop
    # models promote / rollback after make stop start it again, and leave a running one
    line = steps.start_scorer_if_stopped(cfg, local=True)
    assert line is not None and "scorer running" in line
    third = scoring.local_scorer_pid("events")
    assert third and third not in (first, second)
    scorer_pid = orjson.loads(status_file.read_bytes())["pid"]
    assert steps.start_scorer_if_stopped(cfg, local=True) == (
        f"scorer running (supervisor pid {third}, scorer pid {scorer_pid}), "
        "following the served version"
    )
    assert steps.start_scorer_if_stopped(cfg, local=False) is None  # the cluster's Deployment
    assert scoring.stop_all_local_scorers() == ["events"]
    # a pipeline without scoring.stream starts nothing
    assert steps.roll_scorer(cfg.model_copy(update={"scoring": type(cfg.scoring)()}), True) is None


def test_redis_killed_mid_run_loses_nothing(project, tmp_path: Path) -> None:
    """SIGKILL the Redis server while a supervised scorer commits on its own thread.

    The scorer exits with one line naming Redis; its supervisor starts it again, which
    starts the project's Redis again from its append-only file; every record ends up
    scored or dead-lettered, a record scored twice shows the same source entry, and
    nothing stays pending.
    """
    redis_dir = project["root"] / "redis"
    engine = RedisStreams(project["url"], STREAMS, consumer="test-producer")
    engine.r.delete(STREAMS.input, STREAMS.output, STREAMS.dead_letter)
    engine.r.xgroup_create(STREAMS.input, STREAMS.group, id="0", mkstream=True)
    records, bad = make_records(6000, bad_every=40, seed=11)
    engine.produce([(None, v) for v in records])
    engine.close()
    log_path = tmp_path / "scorer.log"
    with open(log_path, "wb") as log:
        sup = subprocess.Popen(
            [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
             "--consumer", "survivor", "--supervise"],
            env=project["env"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def reachable() -> RedisStreams | None:
        try:
            return RedisStreams(project["url"], STREAMS, consumer="test-watch", deadline_s=5)
        except Exception:
            return None

    try:
        watch = reachable()
        assert watch is not None
        _wait(lambda: watch.r.xlen(STREAMS.output) >= 500, 60, "the first scores", poll=0.002)
        os.kill(int((redis_dir / redis_server.PID_FILE).read_text()), signal.SIGKILL)
        watch.close()

        def finished() -> bool:
            w = reachable()
            if w is None:
                return False
            try:
                done = w.r.xlen(STREAMS.output) + w.r.xlen(STREAMS.dead_letter)
                return done >= 6000 and w.r.xpending(STREAMS.input, STREAMS.group)["pending"] == 0
            finally:
                w.close()

        _wait(finished, 120, "every record after the Redis restart", poll=0.2)
    finally:
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    r = reachable()
    assert r is not None
    scores, dead = _entries(r.r, STREAMS.output), _entries(r.r, STREAMS.dead_letter)
    r.close()
    valid = {f"ev-{i}" for i in range(6000)} - bad
    sources = collections.defaultdict(set)
    for s in scores:
        sources[s["id"]].add(s["source"])
    assert set(sources) == valid
    assert all(len(v) == 1 for v in sources.values()), "a record scored from two entries"
    assert {d["id"] for d in dead} == bad
    text = log_path.read_text()
    assert "trainyard score-stream: StreamError: redis " in text, text[-3000:]
    assert "scorer exited with 1; restarting" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_commit_writes_and_acknowledges_all_or_nothing(project) -> None:
    """An output key that is not a stream: nothing written, nothing acknowledged."""
    streams = Streams("wt.in", "wt.out", "wt.dead", "wt-group")
    engine = RedisStreams(project["url"], streams, consumer="wt")
    r = engine.r
    try:
        engine.produce([(None, b'{"id": "ev-%d"}' % i) for i in range(3)])
        messages = engine.read(10, 10)
        outs = [Output.of(f"ev-{i}", {"id": f"ev-{i}", "score": 0.5}) for i in range(3)]
        dead = [Output.of("ev-x", {"id": "ev-x", "reason": "r"})]
        r.set("wt.dead", "not a stream")
        with pytest.raises(StreamError, match=r"WRONGTYPE wt\.dead holds a string"):
            engine.commit(outs, dead, messages)
        assert r.xpending("wt.in", "wt-group")["pending"] == 3
        assert r.exists("wt.out") == 0, "a score was written for an unacknowledged batch"
        r.delete("wt.dead")
        r.script_flush()  # a restarted server has forgotten the script: loaded again
        engine.commit(outs, dead, messages)
        assert r.xpending("wt.in", "wt-group")["pending"] == 0
        assert (r.xlen("wt.out"), r.xlen("wt.dead")) == (3, 1)
    finally:
        r.delete("wt.in", "wt.out", "wt.dead")
        engine.close()


def _in_process_scorer(project, streams: Streams):
    """A scorer of the events contract on ``streams``, in this process (member ``s``)."""
    from trainyard.contracts import parse_contract_text
    from trainyard.streaming.model_endpoint import ModelEndpoint
    from trainyard.streaming.records import RecordChecker
    from trainyard.streaming.scorer import Scorer

    checker = RecordChecker(parse_contract_text(CONTRACT, Path("events.yaml")))
    endpoint = ModelEndpoint("127.0.0.1", project["port"], "events")
    return Scorer(RedisStreams(project["url"], streams, consumer="s"), checker, endpoint)


def test_a_record_the_model_cannot_take_is_dead_lettered_and_the_rest_scored(project) -> None:
    """Contract-valid values beyond float32, and a batch the server refuses, one by one."""
    from trainyard.streaming.scorer import _Batch

    streams = Streams("big.in", "big.out", "big.dead", "big-group")
    engine = RedisStreams(project["url"], streams, consumer="big")
    r = engine.r
    r.delete("big.in", "big.out", "big.dead")
    records, _ = make_records(20, seed=3)
    huge = [
        orjson.dumps({"id": "ev-9001", "a": 5.0, "b": 1e39}),
        b'{"id": "ev-9002", "a": 1.0, "b": -3.5e38}',
    ]
    engine.produce([(None, v) for v in records[:10] + huge + records[10:]])
    scorer = _in_process_scorer(project, streams)
    try:
        stats = scorer.run(max_records=22, exit_when_idle_s=5)
        assert (stats.scored, stats.dead) == (20, 2)
        dead = {d["id"]: d for d in _entries(r, "big.dead")}
        assert set(dead) == {"ev-9001", "ev-9002"}
        assert dead["ev-9001"]["reason"] == "b: 1e+39 does not fit the model's float32 input"
        assert dead["ev-9001"]["value"] == huge[0].decode()
        assert len({s["id"] for s in _entries(r, "big.out")}) == 20
        assert r.xpending("big.in", "big-group")["pending"] == 0

        # a batch the server refuses (a string where a number goes) goes one by one
        got = scorer._score({"a": np.asarray([1.0, "x"], object), "b": np.float32([1, 2])}, 2)
        assert list(got.refused) == [1] and "got strings" in got.refused[1]
        assert isinstance(got.versions, list) and isinstance(got.versions[0], int)
        assert got.versions[1] is None

        # ... and the row it refused is dead-lettered, the other scored, both acknowledged
        r.delete("big.out", "big.dead")
        engine.produce([(None, v) for v in records[:2]])
        messages = scorer.engine.read(2, 100)
        keys = [orjson.loads(m.value)["id"] for m in messages]
        batch = _Batch(messages, [], keys, [m.id for m in messages], [{}, {}], [b"r0", b"r1"])
        batch.future = cf.Future()
        batch.future.set_result(got)
        scorer._finish(batch)
        assert [(d["id"], d["value"]) for d in _entries(r, "big.dead")] == [(keys[1], "r1")]
        assert "model server refused the record: " in _entries(r, "big.dead")[0]["reason"]
        assert [(o["id"], o["version"]) for o in _entries(r, "big.out")] == [
            (keys[0], got.versions[0])
        ]
        assert r.xpending("big.in", "big-group")["pending"] == 0
    finally:
        r.delete("big.in", "big.out", "big.dead")
        engine.close()


def test_an_entry_without_a_value_field_is_dead_lettered_with_its_fields(project) -> None:
    """A producer that names the field otherwise: its entry's dead letter says so and keeps
    what it wrote (it used to read as "empty" with nothing kept), also when claimed."""
    streams = Streams("nv.in", "nv.out", "nv.dead", "nv-group")
    engine = RedisStreams(project["url"], streams, consumer="nv")
    r = engine.r
    r.delete("nv.in", "nv.out", "nv.dead")
    records, _ = make_records(4, seed=5)
    r.xadd("nv.in", {"data": records[0]})
    r.xadd("nv.in", {"id": "ev-7", "a": "3.5", "key": "k-7"})
    engine.produce([(None, v) for v in records[1:3]])
    r.xadd("nv.in", {"payload": b"\xff\xfe"})
    scorer = _in_process_scorer(project, streams)
    try:
        stats = scorer.run(max_records=5, exit_when_idle_s=5)
        assert (stats.scored, stats.dead) == (2, 3)
        dead = _entries(r, "nv.dead")
        assert [d["reason"] for d in dead] == [
            "no 'value' field in the entry (its fields: data)",
            "no 'value' field in the entry (its fields: id, a, key)",
            "no 'value' field in the entry (its fields: payload)",
        ]
        assert orjson.loads(dead[0]["value"]) == {"data": records[0].decode()}
        assert orjson.loads(dead[1]["value"]) == {"id": "ev-7", "a": "3.5", "key": "k-7"}
        assert orjson.loads(dead[2]["value"]) == {"payload": "\ufffd\ufffd"}
        assert [d["id"] for d in dead] == [None, "k-7", None]
        # claimed (another member left it pending), the same
        r.xadd("nv.in", {"data": b"x"})
        engine.read(10, 1)
        (claimed,) = scorer.engine.claim(0, 10)
        assert claimed.fields is not None and orjson.loads(claimed.fields) == {"data": "x"}
    finally:
        r.delete("nv.in", "nv.out", "nv.dead")
        engine.close()


def test_a_deleted_input_stream_gets_its_group_again(project, caplog) -> None:
    streams = Streams("gone.in", "gone.out", "gone.dead", "gone-group")
    engine = RedisStreams(project["url"], streams, consumer="g")
    try:
        assert engine.read(10, 1) == []
        engine.r.delete("gone.in")  # the group goes with it
        engine.produce([(None, b'{"id": "ev-1"}'), (None, b'{"id": "ev-2"}')])
        assert [m.value for m in engine.read(10, 1)] == [b'{"id": "ev-1"}', b'{"id": "ev-2"}']
        assert "has no group gone-group (deleted?)" in caplog.text
    finally:
        engine.r.delete("gone.in")
        engine.close()


def test_lag_is_counted_when_a_restarted_redis_lost_count(tmp_path: Path, monkeypatch) -> None:
    """Redis 7.0 replays the group's reads from its append-only file without the count of
    entries read, and reports no lag until the group reaches the stream's end again (or,
    after a SIGKILL, a wrong one): the scorer counts."""
    from trainyard.streaming import engines

    streams = Streams("lag.in", "lag.out", "lag.dead", "lag-group")
    url = redis_server.ensure_running(tmp_path / "redis")
    try:
        engine = RedisStreams(url, streams, consumer="c")
        records, _ = make_records(25, seed=5)
        engine.produce([(None, v) for v in records])
        assert len(engine.read(5, 100)) == 5
        assert engine.lag() == {"lag": 20, "pending": 5}
        engine.close()
        redis_server.stop(tmp_path / "redis")
        redis_server.ensure_running(tmp_path / "redis")
        engine = RedisStreams(url, streams, consumer="c")
        (group,) = engine.r.xinfo_groups("lag.in")
        assert group["lag"] is None  # what Redis itself says now
        assert engine.lag() == {"lag": 20, "pending": 5}
        monkeypatch.setattr(engines, "LAG_COUNT_MAX", 7)
        assert engine.lag() == {"lag": 7, "pending": 5}  # counted up to the cap: at least
        monkeypatch.undo()
        assert len(engine.read(100, 100)) == 20  # the end: Redis counts again
        assert engine.lag() == {"lag": 0, "pending": 25}
        # a wrong count (a cold user's SIGKILLed Redis kept lag 24912 with nothing unread)
        (group,) = engine.r.xinfo_groups("lag.in")
        last = group["last-delivered-id"]
        engine.r.execute_command("XGROUP", "SETID", "lag.in", "lag-group", last, "ENTRIESREAD", 3)
        assert engine.r.xinfo_groups("lag.in")[0]["lag"] == 22
        assert engine.lag() == {"lag": 0, "pending": 25}
        engine.close()
    finally:
        redis_server.stop(tmp_path / "redis")


def _redis_servers(redis_dir: Path) -> list[int]:
    """Pids of redis-server processes serving ``redis_dir``'s socket."""
    import psutil

    sock = str(redis_dir.resolve() / redis_server.SOCKET)
    return [
        p.pid
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "redis-server" and sock in " ".join(p.info["cmdline"] or [])
    ]


def test_scorers_restarted_at_once_start_one_redis(tmp_path: Path) -> None:
    """A cold user's two scorers, restarted together after a Redis SIGKILL, each started a
    server on the same socket and append-only file; one wrote to a deleted file."""
    import concurrent.futures as futures

    folder = tmp_path / "redis"
    try:
        for _ in range(2):  # a fresh folder, then one whose server was SIGKILLed
            with futures.ThreadPoolExecutor(4) as pool:
                urls = set(pool.map(lambda _: redis_server.ensure_running(folder), range(4)))
            assert len(urls) == 1
            servers = _redis_servers(folder)
            assert len(servers) == 1, servers
            os.kill(servers[0], signal.SIGKILL)
            _wait(lambda: not _redis_servers(folder), 10, "the killed Redis")
    finally:
        redis_server.stop(folder)
        for pid in _redis_servers(folder):  # the extra ones a failure leaves
            os.kill(pid, signal.SIGKILL)


def test_the_projects_redis_in_a_folder_with_a_space_listens_on_its_socket_only(
    tmp_path: Path,
) -> None:
    """A Redis folder with a space broke its config; and a client could open TCP at run
    time (``CONFIG SET port 6379``): the socket is the server's only door."""
    import psutil
    import redis

    folder = tmp_path / "my redis"
    try:
        url = redis_server.ensure_running(folder)
        client = redis.Redis(unix_socket_path=str(folder.resolve() / redis_server.SOCKET))
        assert client.ping() and url.startswith("unix://")
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("CONFIG", "SET", "port", "6399")
        (pid,) = _redis_servers(folder)
        assert psutil.Process(pid).net_connections(kind="inet") == []
    finally:
        redis_server.stop(folder)


def test_two_deploys_at_once_leave_one_scorer(project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two deploys rolling the scorer together left two supervisors; make stop stopped one."""
    import concurrent.futures as futures

    import psutil

    from trainyard.streaming import local_scorer as scoring

    for k, v in project["env"].items():
        if k.startswith("TRAINYARD_"):
            monkeypatch.setenv(k, v)

    def supervisors() -> list[int]:
        return [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if {"score-stream", "--supervise", "events"} <= set(p.info["cmdline"] or [])
        ]

    try:
        with futures.ThreadPoolExecutor(2) as pool:
            pids = list(pool.map(lambda _: scoring.start_local_scorer("events"), range(2)))
        assert len(set(pids)) == 2  # the second stopped the first's and started its own
        assert supervisors() == [scoring.local_scorer_pid("events")] == [pids[1]] or (
            supervisors() == [scoring.local_scorer_pid("events")] == [pids[0]]
        )
    finally:
        assert scoring.stop_all_local_scorers() == ["events"]
        left = supervisors()
        for pid in left:  # what a failure leaves
            os.killpg(pid, signal.SIGTERM)
    assert left == []


def test_the_status_file_says_why_a_scorer_keeps_failing(project, tmp_path: Path) -> None:
    """A dead-letter key that is not a stream: the supervised scorer failed and restarted
    forever while its status said running, server ok, no error."""
    from trainyard.contracts import parse_contract_text
    from trainyard.streaming.model_endpoint import ModelEndpoint
    from trainyard.streaming.records import RecordChecker
    from trainyard.streaming.scorer import Scorer

    streams = Streams("st.in", "st.out", "st.dead", "st-group")
    engine = RedisStreams(project["url"], streams, consumer="st")
    r = engine.r
    r.delete("st.in", "st.out", "st.dead")
    status = tmp_path / "status.json"
    checker = RecordChecker(parse_contract_text(CONTRACT, Path("events.yaml")))

    def scorer() -> Scorer:
        endpoint = ModelEndpoint("127.0.0.1", project["port"], "events")
        return Scorer(
            RedisStreams(project["url"], streams, consumer="s"), checker, endpoint,
            status_file=status, claim_idle_s=0.1,
        )  # fmt: skip

    try:
        r.set("st.dead", "not a stream")
        engine.produce([(None, b"not json")])
        with pytest.raises(StreamError, match="WRONGTYPE"):
            scorer().run(max_records=1)
        doc = orjson.loads(status.read_bytes())
        assert doc["state"] == "failed" and "WRONGTYPE st.dead" in doc["error"]
        again = scorer()  # as the supervisor's restart: it says what failed before
        again.report()
        doc = orjson.loads(status.read_bytes())
        assert doc["state"] == "running" and "WRONGTYPE st.dead" in doc["last_failure"]
        r.delete("st.dead")  # fixed: once a batch commits, the failure is history
        again.run(max_records=1, exit_when_idle_s=2)
        doc = orjson.loads(status.read_bytes())
        assert doc["state"] == "stopped" and doc["error"] is None and doc["last_failure"] is None
        assert r.xlen("st.dead") == 1
    finally:
        r.delete("st.in", "st.out", "st.dead")
        engine.close()


def test_a_refused_commit_does_not_make_a_good_record_poison(project, tmp_path: Path) -> None:
    """Found by a cold user: with the scores key holding a string, each restarted scorer
    claimed the pending record, failed its commit (WRONGTYPE) and exited; every claim
    counted a delivery, and once the key was fixed the valid record was dead-lettered
    "delivered 4 times and never acknowledged"."""
    from trainyard.contracts import parse_contract_text
    from trainyard.streaming.model_endpoint import ModelEndpoint
    from trainyard.streaming.records import RecordChecker
    from trainyard.streaming.scorer import Scorer

    streams = Streams("rc.in", "rc.out", "rc.dead", "rc-group")
    engine = RedisStreams(project["url"], streams, consumer="rc")
    r = engine.r
    r.delete("rc.in", "rc.out", "rc.dead")
    checker = RecordChecker(parse_contract_text(CONTRACT, Path("events.yaml")))

    def scorer(n: int) -> Scorer:
        endpoint = ModelEndpoint("127.0.0.1", project["port"], "events")
        return Scorer(
            RedisStreams(project["url"], streams, consumer=f"s{n}"), checker, endpoint,
            claim_idle_s=0.1,
        )  # fmt: skip

    try:
        r.set("rc.out", "not a stream")
        (record,), _ = make_records(1, seed=3)
        engine.produce([("ev-0", record)])
        for n in range(5):  # a supervisor restarting the scorer while the key is wrong
            time.sleep(0.15)  # idle past claim_idle_s: the next scorer claims it
            with pytest.raises(StreamError, match="WRONGTYPE"):
                scorer(n).run(max_records=1)
        (pending,) = r.xpending_range("rc.in", "rc-group", "-", "+", 10)
        assert pending["times_delivered"] <= 1, pending
        r.delete("rc.out")  # fixed
        time.sleep(0.15)
        scorer(9).run(max_records=1, exit_when_idle_s=1)
        assert r.xlen("rc.dead") == 0, _entries(r, "rc.dead")
        assert [e["id"] for e in _entries(r, "rc.out")] == ["ev-0"]
    finally:
        r.delete("rc.in", "rc.out", "rc.dead")
        engine.close()


def test_a_slow_server_does_not_make_the_scorer_claim_its_own_batches(project) -> None:
    """Batches at a server slower than ``claim_idle_s`` are idle pending entries of the
    scorer itself: its claims must leave them alone, or each would be scored twice."""
    import http.server
    import threading

    from trainyard.contracts import parse_contract_text
    from trainyard.streaming.model_endpoint import ModelEndpoint
    from trainyard.streaming.records import RecordChecker
    from trainyard.streaming.scorer import Scorer

    class SlowProxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if method == "POST":
                time.sleep(0.6)  # three times claim_idle_s
            with ServingClient("127.0.0.1", project["port"]) as c:
                status, data = c.request(method, self.path, body if method == "POST" else None)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._forward("GET")

        def do_POST(self) -> None:
            self._forward("POST")

        def log_message(self, *args: object) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    streams = Streams("slow.in", "slow.out", "slow.dead", "slow-group")
    engine = RedisStreams(project["url"], streams, consumer="producer")
    r = engine.r
    r.delete("slow.in", "slow.out", "slow.dead")
    records, _ = make_records(1000, seed=11)
    engine.produce([(None, v) for v in records])
    checker = RecordChecker(parse_contract_text(CONTRACT, Path("events.yaml")))
    endpoint = ModelEndpoint("127.0.0.1", proxy.server_address[1], "events")
    scorer = Scorer(
        RedisStreams(project["url"], streams, consumer="s"), checker, endpoint,
        batch_size=128, claim_idle_s=0.2,
    )  # fmt: skip
    try:
        stats = scorer.run(max_records=1000, exit_when_idle_s=5)
        assert (stats.scored, stats.dead, stats.claimed) == (1000, 0, 0)
        ids = [s["id"] for s in _entries(r, "slow.out")]
        assert len(ids) == len(set(ids)) == 1000
        assert r.xpending("slow.in", "slow-group")["pending"] == 0
    finally:
        proxy.shutdown()
        scorer.engine.close()
        r.delete("slow.in", "slow.out", "slow.dead")
        engine.close()


def test_reads_give_each_entry_as_written(project) -> None:
    """What ``read`` makes of every entry a real Redis sends: plain ones with hostile
    bytes, a keyed one, one without a value field, and nothing (BLOCK runs out)."""
    r = RedisStreams(project["url"], STREAMS, consumer="producer").r
    r.delete("rd.in")
    values = [b"", b"\r\n", b"$5\r\nvalue\r\n*-1\r\n", bytes(range(256)), b"{}" * 600]
    ids = [r.xadd("rd.in", {"value": values[i % len(values)]}).decode() for i in range(40)]
    ids.append(r.xadd("rd.in", {"key": "k-1", "value": b"v"}).decode())
    ids.append(r.xadd("rd.in", {"data": "x", "more": b"\xff"}).decode())
    ids += [r.xadd("rd.in", {"value": b'{"id": "ev-%d"}' % i}).decode() for i in range(30)]
    engine = RedisStreams(project["url"], Streams("rd.in", "x", "y", "rd-group"), consumer="c")
    try:
        got = [engine.read(16, 10) for _ in range(6)]
        assert [len(b) for b in got] == [16, 16, 16, 16, 8, 0]
        messages = [m for b in got for m in b]
        assert [m.id for m in messages] == ids
        want = [Message(i, values[n % len(values)]) for n, i in enumerate(ids[:40])]
        assert messages[:40] == want  # every field: the id, the value, nothing else
        assert (messages[40].key, messages[40].value) == ("k-1", b"v")
        assert (messages[41].value, orjson.loads(messages[41].fields)) == (
            b"",
            {"data": "x", "more": "\ufffd"},
        )
    finally:
        engine.close()
        r.delete("rd.in")


def test_a_record_that_hangs_every_scorer_is_dead_lettered(project, tmp_path: Path) -> None:
    """A regex the contract check cannot see is catastrophic (ten ``a*`` in a row: about
    60**10 ways to try on 60 a's and a mismatch) hung the scorer for ever, its status
    still "running". Now its supervisor
    kills it once its status is stale; the records of the batch it hung on are claimed
    one at a time, and the one that hangs every scorer is dead-lettered on its third
    delivery (``max_deliveries`` 2, the default): every other record is scored once."""
    root = tmp_path / "poison"
    env = {**project["env"], **write_project(root, project["port"], batch_size=64)}
    env["TRAINYARD_REDIS_DIR"] = project["env"]["TRAINYARD_REDIS_DIR"]  # the project's Redis
    contract = root / "contracts" / "events.yaml"
    slow = '"^ev-' + "a*" * 10 + '[0-9]+$"'
    text = contract.read_text().replace('"^ev-[0-9]+$", max_length: 32', slow)
    contract.write_text(text)
    pipeline = root / "pipelines" / "events.yaml"
    pipeline.write_text(
        pipeline.read_text()
        .replace("events.", "poison.")
        .replace("claim_idle_s: 2.0", "claim_idle_s: 0.5")
    )
    streams = Streams("poison.in", "poison.scores", "poison.dead", "trainyard-events")
    engine = RedisStreams(project["url"], streams, consumer="producer")
    r = engine.r
    r.delete("poison.in", "poison.scores", "poison.dead")
    records, _ = make_records(100, seed=13)
    poison = b'{"id": "ev-%b!", "a": 1.0, "b": 2.0}' % (b"a" * 60)
    engine.produce([(None, v) for v in [*records[:30], poison, *records[30:]]])
    status = root / "status.json"
    log = open(root / "scorer.log", "wb")  # noqa: SIM115 - closed by the OS
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainyard", "score-stream", "--pipeline", "events",
         "--supervise", "--report-s", "0.5", "--status-file", str(status)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait(lambda: r.xlen("poison.dead") == 1, 120, "the poison record's dead letter")
        _wait(lambda: r.xlen("poison.scores") == 100, 60, "the other records' scores")
        (dead,) = _entries(r, "poison.dead")
        assert dead["value"] == poison.decode()
        assert dead["id"] == orjson.loads(poison)["id"]  # found by its key, as others are
        assert dead["reason"].startswith("delivered 3 times and never acknowledged")
        ids = [s["id"] for s in _entries(r, "poison.scores")]
        assert sorted(ids) == sorted(orjson.loads(x)["id"] for x in records)
        _wait(lambda: r.xpending("poison.in", "trainyard-events")["pending"] == 0, 30, "acks")
        _wait(lambda: orjson.loads(status.read_bytes())["dead_lettered"] == 1, 10, "the status")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        r.delete("poison.in", "poison.scores", "poison.dead")
        engine.close()
    text = (root / "scorer.log").read_text()
    assert text.count("killed by its supervisor") == 2, text[-3000:]
