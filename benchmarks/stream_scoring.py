"""Stream scoring benchmark: stream → model → stream vs direct batched ``:predict``.

Measures, in one run, against a real ``trainyard serve`` process and the project's real
Redis server (both in a temporary folder):

* records/s end to end: ``--records`` JSON records waiting in the input stream are read by
  the scorer (consumer group), checked against the contract, scored through the REST API
  in batches of ``--batch`` (``--in-flight`` at the server), and written with their
  acknowledgement to the output stream; timed from the scorer's start to its last commit;
* records/s of the same records scored by direct batched ``:predict`` calls: each record
  decoded, batches of ``--batch`` built as columns and posted on ``--in-flight`` keep-alive
  connections, the responses decoded (no stream, no contract, nothing written);
* the floor: the same Redis commands and ``:predict`` calls with everything the scorer
  computes per record done before the timer (:func:`_floor`): the stream's and the
  model's work alone; ``floor_ratio`` is its records/s over the baseline's;
* where ours spends its CPU per record (the scorer, the model server, Redis), and Redis's
  part measured apart for each thing the scorer asks of it (reading through the group,
  with ``NOACK`` for comparison, and the commit of scores and acknowledgements);
* p50/p99 record latency: records produced at a steady rate (half the measured
  throughput) while the scorer runs; a record's latency is its output entry's time minus
  its input entry's time (both Redis stream ids, one clock).

The two throughputs are measured in alternating rounds; ``ratio`` is the median of the
per-round ratios. The machine may be shared, so CPU time per record is measured too (this
process, the model server and, for the stream, the Redis server): ``cpu_ratio`` is the
baseline's CPU per record over ours, which other load disturbs far less. Last line:
``BENCH stream_scoring ratio=<ours/baseline> ours=<records/s> baseline=<records/s>
p50_ms=<n> p99_ms=<n> ... cpu_ratio=<n> redis_us=<read + commit> floor_ratio=<n> ...``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from tests.support.ports import free_port  # noqa: E402
from tests.support.streams import SPEC, build_models, make_records, write_project  # noqa: E402


class CPU:
    """CPU seconds used by this process (all threads) and the given processes."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = [psutil.Process(p) for p in pids]

    def parts(self) -> list[float]:
        """CPU seconds so far: this process's, then each given process's."""
        return [time.process_time()] + [sum(p.cpu_times()[:2]) for p in self.procs]

    def now(self) -> float:
        """Total CPU seconds so far."""
        return sum(self.parts())


def _baseline(records: list[bytes], port: int, batch: int, in_flight: int) -> float:
    """Seconds to score ``records`` by direct batched ``:predict`` calls."""
    from trainyard.serving.client import ServingClient

    local = threading.local()

    def post(chunk: list[bytes]) -> int:
        client = getattr(local, "c", None) or ServingClient("127.0.0.1", port)
        local.c = client
        rows = [orjson.loads(r) for r in chunk]
        inputs = {
            name: np.fromiter((r[name] for r in rows), dtype=np.float32, count=len(rows))
            for name in ("a", "b")
        }
        body = orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY)
        status, data = client.request("POST", "/v1/models/events:predict", body)
        assert status == 200, data[:200]
        return len(orjson.loads(data)["outputs"]["class_id"])

    chunks = [records[i : i + batch] for i in range(0, len(records), batch)]
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(in_flight) as pool:
        done = sum(pool.map(post, chunks))
    assert done == len(records)
    return time.perf_counter() - t


def _ours(records: list[bytes], cpu: CPU) -> tuple[float, list[float]]:
    """Seconds, and CPU seconds of each of ``cpu``'s parts, for the scorer to score
    ``records`` waiting in the stream."""
    from trainyard.config import load_pipeline
    from trainyard.streaming.scorer import build_scorer, open_engine

    cfg = load_pipeline("events")
    engine = open_engine(cfg, consumer="bench-producer")
    s = cfg.scoring.stream
    engine.r.delete(s.input, s.output, s.dead_letter)
    engine.r.xgroup_create(s.input, f"trainyard-{cfg.name}", id="0", mkstream=True)
    for i in range(0, len(records), 5000):
        engine.produce([(None, v) for v in records[i : i + 5000]])
    scorer = build_scorer("events", report_s=3600)
    c = cpu.parts()
    t = time.perf_counter()
    stats = scorer.run(max_records=len(records))
    took = time.perf_counter() - t
    used = [after - before for before, after in zip(c, cpu.parts(), strict=True)]
    scorer.engine.close()
    assert stats.scored == len(records), (stats.scored, stats.dead)
    assert engine.r.xlen(s.output) == len(records)
    engine.close()
    return took, used


def _floor(
    records: list[bytes], port: int, batch: int, in_flight: int, cpu: CPU
) -> tuple[float, list[float]]:
    """The least any stream scorer must do here: the stream's work and the model's alone.

    Returns seconds, and CPU seconds of each of ``cpu``'s parts.

    The same Redis commands (``XREADGROUP`` through the group, the commit script's
    ``XADD`` per score and ``XACK``) and the same ``:predict`` calls as the scorer,
    with everything the scorer computes per record (JSON, contract, columns, output
    documents) done before the timer starts: ``in_flight`` threads post prebuilt bodies,
    one more commits prebuilt outputs, and this thread reads.
    What is left of this process's CPU is the stream engine's client (redis-py packing
    the commands, hiredis reading the replies, the entries made Messages) and
    ``http.client``: a scorer could beat this only by doing those for less.
    """
    from trainyard.config import load_pipeline
    from trainyard.serving.client import ServingClient
    from trainyard.streaming.engines import Output
    from trainyard.streaming.scorer import open_engine

    engine = open_engine(load_pipeline("events"), consumer="bench-floor")
    s = engine.streams
    engine.r.delete(s.input, s.output, s.dead_letter)
    engine.r.xgroup_create(s.input, s.group, id="0", mkstream=True)
    for i in range(0, len(records), 5000):
        engine.produce([(None, v) for v in records[i : i + 5000]])
    rows = [orjson.loads(r) for r in records]
    bodies, outputs = [], []
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        inputs = {
            name: np.fromiter((r[name] for r in chunk), dtype=np.float32, count=len(chunk))
            for name in ("a", "b")
        }
        bodies.append(orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY))
        outputs.append(
            [Output.of(r["id"], {"id": r["id"], "score": 0.5, "class_id": 1, "version": 1})
             for r in chunk]
        )  # fmt: skip
    local = threading.local()

    def score(k: int) -> None:
        client = getattr(local, "c", None) or ServingClient("127.0.0.1", port)
        local.c = client
        status, data = client.request("POST", "/v1/models/events/versions/1:predict", bodies[k])
        assert status == 200, data[:200]

    def commit(scored: cf.Future[None], k: int, messages: list) -> int:
        scored.result()
        engine.commit(outputs[k][: len(messages)], [], messages)  # shorter on a short read
        return len(messages)

    read = k = 0
    c = cpu.parts()
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(in_flight) as pool, cf.ThreadPoolExecutor(1) as committer:
        out: list[cf.Future[int]] = []
        while read < len(records):
            if len(out) >= 2 * in_flight + 1:  # the scorer's bound on batches out
                cf.wait(out, return_when=cf.FIRST_COMPLETED)
                for f in [f for f in out if f.done()]:
                    f.result()  # a failed batch raises here
                    out.remove(f)
                continue
            messages = engine.read(batch, 1)
            read += len(messages)
            if messages:
                j = k % len(bodies)
                out.append(committer.submit(commit, pool.submit(score, j), j, messages))
                k += 1
    took = time.perf_counter() - t
    used = [after - before for before, after in zip(c, cpu.parts(), strict=True)]
    done = engine.r.xlen(s.output)
    assert done == len(records), (done, len(records))
    engine.r.delete(s.input, s.output, s.dead_letter)
    engine.close()
    return took, used


def _redis_costs(records: list[bytes], redis_pid: int, batch: int) -> dict[str, float]:
    """Redis's CPU (us) per record for each thing the scorer asks of it, measured apart.

    ``read``: delivered through the group (``XREADGROUP``, which adds each entry to the
    pending-entries list and logs that to the append-only file); ``read_noack``: the same
    with ``NOACK`` (no pending entry); ``commit``: the scorer's commit script, one ``XADD``
    per score and the ``XACK``. The scorer's own calls, on the benchmark's project Redis.
    """
    from trainyard.config import load_pipeline
    from trainyard.streaming.engines import Output
    from trainyard.streaming.scorer import open_engine

    engine = open_engine(load_pipeline("events"), consumer="bench-costs")
    s = engine.streams
    engine.r.delete(s.input, s.output, s.dead_letter)
    for i in range(0, len(records), 5000):
        engine.produce([(None, v) for v in records[i : i + 5000]])
    proc = psutil.Process(redis_pid)

    def redis_cpu() -> float:
        t = proc.cpu_times()
        return t.user + t.system

    def fresh_group() -> None:
        engine.r.xgroup_destroy(s.input, s.group)
        engine.r.xgroup_create(s.input, s.group, id="0")

    # Each phase whole: the kernel counts CPU in 10 ms ticks.
    fresh_group()
    c = redis_cpu()
    batches = []
    while messages := engine.read(batch, 1):
        batches.append(messages)
    read = redis_cpu() - c
    outs = [
        [Output.of(m.id, {"id": m.id, "score": 0.5, "class_id": 1, "version": 1}) for m in b]
        for b in batches
    ]
    c = redis_cpu()
    for b, o in zip(batches, outs, strict=True):
        engine.commit(o, [], b)
    commit = redis_cpu() - c
    fresh_group()
    c = redis_cpu()
    while engine.r.xreadgroup(s.group, "bench-costs", {s.input: ">"}, batch, noack=True):
        pass
    read_noack = redis_cpu() - c
    n = sum(len(b) for b in batches)
    assert n == len(records), (n, len(records))
    costs = {"read": read, "read_noack": read_noack, "commit": commit}
    costs = {k: v / n * 1e6 for k, v in costs.items()}
    engine.r.delete(s.input, s.output, s.dead_letter)
    engine.close()
    return costs


def _latency(rate: float, seconds: float) -> tuple[float, float, int]:
    """p50, p99 (ms) of records produced at ``rate``/s while the scorer runs."""
    from trainyard.config import load_pipeline
    from trainyard.streaming.scorer import build_scorer, open_engine

    cfg = load_pipeline("events")
    s = cfg.scoring.stream
    engine = open_engine(cfg, consumer="bench-producer")
    engine.r.delete(s.input, s.output, s.dead_letter)
    scorer = build_scorer("events", report_s=3600)
    runner = threading.Thread(target=scorer.run, daemon=True)
    runner.start()
    records, _ = make_records(int(rate * seconds) + 1, seed=7)
    step = max(1, int(rate / 200))  # 200 small produces a second
    t0 = time.perf_counter()
    for i in range(0, len(records), step):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        engine.produce([(None, v) for v in records[i : i + step]])
    deadline = time.monotonic() + 60
    while engine.r.xlen(s.output) < len(records) and time.monotonic() < deadline:
        time.sleep(0.05)
    scorer.stop.set()
    runner.join(30)
    scorer.engine.close()

    def ms(entry_id: bytes | str) -> int:
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return int(text.split("-")[0])

    lat = [
        ms(out_id) - ms(orjson.loads(f[b"value"])["source"])
        for out_id, f in engine.r.xrange(s.output)
    ]
    engine.close()
    q = np.percentile(lat, [50, 99])
    return float(q[0]), float(q[1]), len(lat)


def main() -> None:
    """Run the benchmark and print the ``BENCH`` line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000, help="records per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating throughput rounds")
    p.add_argument("--batch", type=int, default=256, help="records per :predict call")
    p.add_argument("--in-flight", type=int, default=2, help="batches at the server at once")
    p.add_argument("--latency-seconds", type=float, default=5.0, help="paced phase length")
    p.add_argument("--quick", action="store_true", help="20,000 records, 2 rounds")
    a = p.parse_args()
    if a.quick:
        a.records, a.rounds, a.latency_seconds = 20_000, 2, 3.0

    from trainyard.serving import model_config
    from trainyard.serving.client import ServingClient
    from trainyard.serving.deploy import (
        ensure_local_server,
        publish_version,
        server_pid_file,
        stop_local_server,
        wait_available,
    )
    from trainyard.streaming import redis_server

    with tempfile.TemporaryDirectory(prefix="tybench-") as tmp:
        root = Path(tmp)
        port = free_port()
        env = write_project(
            root, port, batch_size=a.batch, max_in_flight=a.in_flight, claim_idle_s=60
        )
        os.environ.update(env)
        gt, _ = build_models(root / "models")
        serving = root / "volumes" / "_serving"
        publish_version(gt, serving, "events", 1, SPEC)
        model_config.set_served(serving, "events", [1], {model_config.STABLE: 1})
        try:
            ensure_local_server(serving, "127.0.0.1", port)
            redis_server.ensure_running(root / "redis")
            with ServingClient("127.0.0.1", port) as c:
                wait_available(c, "events", 1, 120)
            records, _ = make_records(a.records)
            _baseline(records[: 20 * a.batch], port, a.batch, a.in_flight)  # warm up
            pid_file = server_pid_file(serving, port)
            server_pid = int(orjson.loads(pid_file.read_bytes())["pid"])
            redis_pid = int((root / "redis" / redis_server.PID_FILE).read_text())
            cpu_ours, cpu_base = CPU([server_pid, redis_pid]), CPU([server_pid])
            ours, base, ratios, cpu_ratios, floors = [], [], [], [], []
            for r in range(a.rounds):
                t_ours, parts = _ours(records, cpu_ours)
                c_ours = sum(parts)
                c = cpu_base.now()
                t_base = _baseline(records, port, a.batch, a.in_flight)
                c_base = cpu_base.now() - c
                t_floor, f_used = _floor(records, port, a.batch, a.in_flight, cpu_ours)
                f_us = [x / a.records * 1e6 for x in f_used]
                floors.append(t_base / t_floor)
                ours.append(a.records / t_ours)
                base.append(a.records / t_base)
                ratios.append(ours[-1] / base[-1])
                cpu_ratios.append(c_base / c_ours)
                scorer_us, server_us, redis_us = (x / a.records * 1e6 for x in parts)
                print(
                    f"round {r + 1}: stream {ours[-1]:.0f} records/s "
                    f"({c_ours / a.records * 1e6:.1f} us CPU per record: scorer "
                    f"{scorer_us:.1f}, model server {server_us:.1f}, Redis {redis_us:.1f}), "
                    f"direct predict {base[-1]:.0f} records/s "
                    f"({c_base / a.records * 1e6:.1f} us), "
                    f"ratio {ratios[-1]:.3f}, cpu_ratio {cpu_ratios[-1]:.3f}; "
                    f"the stream's and the model's work alone {a.records / t_floor:.0f} "
                    f"records/s (floor_ratio {floors[-1]:.3f}; {sum(f_us):.1f} us CPU per "
                    f"record: client {f_us[0]:.1f}, model server {f_us[1]:.1f}, "
                    f"Redis {f_us[2]:.1f})",
                    flush=True,
                )
            costs = _redis_costs(records, redis_pid, a.batch)
            print(
                "Redis CPU per record: {read:.2f} us delivered through the group, "
                "{read_noack:.2f} with NOACK (no pending entry), {commit:.2f} for the scores' "
                "XADD and the XACK".format(**costs)
            )
            p50, p99, n = _latency(statistics.median(ours) / 2, a.latency_seconds)
            print(f"latency at {statistics.median(ours) / 2:.0f} records/s: {n} records")
        finally:
            stop_local_server(serving)
            redis_server.stop(root / "redis")
    print(
        f"BENCH stream_scoring ratio={statistics.median(ratios):.3f} "
        f"ours={statistics.median(ours):.0f} baseline={statistics.median(base):.0f} "
        f"p50_ms={p50:.1f} p99_ms={p99:.1f} ratio_min={min(ratios):.3f} "
        f"ratio_max={max(ratios):.3f} cpu_ratio={statistics.median(cpu_ratios):.3f} "
        f"redis_us={costs['read'] + costs['commit']:.2f} "
        f"floor_ratio={statistics.median(floors):.3f} "
        f"batch={a.batch} in_flight={a.in_flight} "
        f"records={a.records} rounds={a.rounds}"
    )


if __name__ == "__main__":
    main()
