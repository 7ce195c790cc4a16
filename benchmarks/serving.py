"""Serving benchmark: HTTP on loopback vs calling the same SavedModel in-process.

Measures, in one run, against a real ``trainyard serve`` process:

* rows/s of batched ``:predict`` requests (row format, ``--batch`` rows each, ``--clients``
  keep-alive connections; request bodies are encoded once, responses are decoded), against
  rows/s of the same batches through ``signatures["serving_default"]`` in this process;
* p50/p99 latency of single-row requests under ``--clients`` concurrent clients;
* the latency added over in-process at batch 1 (one client, p50 minus p50);
* CPU time per row of each side (the machine may be shared: wall-clock figures are noisy).

The two throughputs are measured in alternating rounds; ``ratio`` is the median of the
per-round ratios (each round's pair saw about the same load from other processes), and
``cpu_ratio`` is in-process CPU per row over server plus client CPU per row, which other
load disturbs far less. Each side's CPU is divided by the rows it actually computed or
had answered, and the HTTP side's is counted from its first measured request (each
connection's warm-up request before that is neither counted nor charged).

The model is the digits pipeline's ``small_cnn`` shape (conv 32 → pool → conv 64 → dense 64
→ 10) with random weights, on 8x8x1 images. Last line:
``BENCH serving ratio=<http/in-process> ours=<rows/s> baseline=<rows/s> p50_ms=<n> p99_ms=<n>
... cpu_ratio=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from trainyard.serving.client import ServingClient  # noqa: E402
from trainyard.serving.deploy import (  # noqa: E402
    ensure_local_server,
    publish_version,
    stop_local_server,
    wait_available,
)
from trainyard.serving.model_config import set_served  # noqa: E402

SPEC = {"image": ("float32", (None, 8, 8, 1))}


def build_model(path: Path) -> None:
    import tensorflow as tf

    g = tf.random.Generator.from_seed(0)

    class SmallCNN(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k1 = tf.Variable(g.normal([3, 3, 1, 32]) * 0.3)
            self.k2 = tf.Variable(g.normal([3, 3, 32, 64]) * 0.06)
            self.w1 = tf.Variable(g.normal([4 * 4 * 64, 64]) * 0.03)
            self.w2 = tf.Variable(g.normal([64, 10]) * 0.1)

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")])
        def serve(self, image: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.nn.relu(tf.nn.conv2d(image, self.k1, 1, "SAME"))
            x = tf.nn.max_pool2d(x, 2, 2, "VALID")
            x = tf.nn.relu(tf.nn.conv2d(x, self.k2, 1, "SAME"))
            x = tf.nn.relu(tf.reshape(x, [-1, 4 * 4 * 64]) @ self.w1)
            probs = tf.nn.softmax(x @ self.w2)
            return {"probabilities": probs, "class_id": tf.argmax(probs, axis=1)}

    m = SmallCNN()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve})


def add_common_args(p: argparse.ArgumentParser) -> None:
    """The options the REST and gRPC serving benchmarks share."""
    p.add_argument("--quick", action="store_true", help="short phases (about a minute in all)")
    p.add_argument("--batch", type=int, default=256, help="rows per batched request")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    p.add_argument(
        "--batch-clients",
        type=int,
        default=4,
        help="connections posting batches (a server's throughput needs requests in flight "
        "beside the ones being computed: each connection waits for its answer)",
    )
    p.add_argument("--rounds", type=int, default=5, help="alternating throughput rounds")


def publish_bench_model(tmp_path: Path) -> Path:
    """Build the benchmark's model and serve it as the deploy step does; the serving root."""
    build_model(tmp_path / "model")
    root = tmp_path / "serving"
    publish_version(tmp_path / "model", root, "bench", 1, SPEC)
    set_served(root, "bench", [1], {"stable": 1})
    return root


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def in_process_rows_s(fn: object, batch: np.ndarray, seconds: float) -> tuple[float, int]:
    """rows/s calling the signature on ``batch`` repeatedly (outputs fetched to numpy).

    Returns:
        rows/s and the rows computed.
    """
    import tensorflow as tf

    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        {k: v.numpy() for k, v in fn(image=tf.constant(batch)).items()}  # type: ignore[operator]
        n += 1
    return n * len(batch) / (time.perf_counter() - t0), n * len(batch)


def in_process_p50(fn: object, row: np.ndarray, seconds: float) -> float:
    """Median latency (s) of one-row calls."""
    import tensorflow as tf

    lat = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        {k: v.numpy() for k, v in fn(image=tf.constant(row)).items()}  # type: ignore[operator]
        lat.append(time.perf_counter() - t)
    return statistics.median(lat)


def http_load(
    port: int,
    body: bytes,
    rows: int,
    clients: int,
    seconds: float,
    procs: tuple[psutil.Process, ...] = (),
) -> tuple[float, list[float], list[float]]:
    """``clients`` threads posting ``body`` repeatedly, each after one unmeasured request.

    Returns:
        rows/s, per-request latencies, and the CPU seconds each of ``procs`` used per row
        answered, both counted from the first measured request to the last answer.
    """
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    ready, start = threading.Barrier(clients + 1), threading.Barrier(clients + 1)

    def run(i: int) -> None:
        c = ServingClient("127.0.0.1", port)
        c.request("POST", "/v1/models/bench:predict", body)
        ready.wait()
        start.wait()
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t = time.perf_counter()
            status, data = c.request("POST", "/v1/models/bench:predict", body)
            doc = orjson.loads(data)
            lat[i].append(time.perf_counter() - t)
            if status != 200 or len(doc["predictions"]) != rows:
                errors.append(f"HTTP {status}: {data[:200]!r}")
                break
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    ready.wait()  # connections open and warm: count CPU from here
    cpu0 = [_cpu(p) for p in procs]
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"request failed: {errors[0]}")
    flat = [x for per in lat for x in per]
    answered = len(flat) * rows
    cpu = [(_cpu(p) - c0) / answered for p, c0 in zip(procs, cpu0, strict=True)]
    return answered / elapsed, flat, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--clients", type=int, default=4, help="concurrent connections")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    args = p.parse_args()
    if not args.port:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            args.port = int(probe.getsockname()[1])
    seconds = 2.0 if args.quick else args.seconds
    if args.quick:
        args.rounds = 3

    rng = np.random.default_rng(0)
    batch = rng.random((args.batch, 8, 8, 1), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        tmp_path = Path(tmp)
        root = publish_bench_model(tmp_path)
        pid = ensure_local_server(root, "127.0.0.1", args.port)
        try:
            with ServingClient("127.0.0.1", args.port) as c:
                wait_available(c, "bench", 1, 120)
                served = c.predict("bench", inputs=batch[:16].tolist())["class_id"]
            import gc

            import tensorflow as tf

            fn = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
            gc.collect()
            gc.freeze()  # as the server does: keep full collections off TensorFlow's objects
            want = fn(image=tf.constant(batch[:16]))["class_id"].numpy().tolist()
            assert served == want, "served predictions differ from in-process ones"
            in_process_rows_s(fn, batch, 0.5)

            # Alternate the two measurements so load from other processes hits both alike.
            body = json.dumps({"instances": batch.tolist()}).encode()
            base_runs, http_runs = [], []
            server, me = psutil.Process(pid), psutil.Process()
            cpu = {"in-process": 0.0, "server": 0.0, "client": 0.0}
            for _ in range(args.rounds):
                m0 = _cpu(me)
                rows_s, computed = in_process_rows_s(fn, batch, seconds)
                base_runs.append(rows_s)
                cpu["in-process"] += (_cpu(me) - m0) / computed
                rows_s, _, (server_cpu, client_cpu) = http_load(
                    args.port, body, args.batch, args.batch_clients, seconds, (server, me)
                )
                http_runs.append(rows_s)
                cpu["server"] += server_cpu
                cpu["client"] += client_cpu
            cpu_us = {k: v / args.rounds * 1e6 for k, v in cpu.items()}
            base_rows_s = statistics.median(base_runs)
            http_rows_s = statistics.median(http_runs)
            ratio = statistics.median(h / b for b, h in zip(base_runs, http_runs, strict=True))
            base_p50_b1 = in_process_p50(fn, batch[:1], seconds)

            one = json.dumps({"instances": batch[:1].tolist()}).encode()
            _, conc, _ = http_load(args.port, one, 1, args.clients, seconds)
            p50 = statistics.median(conc)
            p99 = float(np.percentile(conc, 99))
            _, seq, _ = http_load(args.port, one, 1, 1, seconds / 2)
            added = statistics.median(seq) - base_p50_b1
        finally:
            stop_local_server(root)
    print(
        f"server pid {pid}, batch {args.batch}, {args.clients} clients, {seconds:.0f}s phases,"
        f" {args.rounds} rounds (medians)"
    )
    print(
        f"in-process: {base_rows_s:,.0f} rows/s at batch {args.batch}; batch-1 p50 "
        f"{base_p50_b1 * 1e3:.3f} ms"
    )
    print(
        f"http:       {http_rows_s:,.0f} rows/s at batch {args.batch} "
        f"({args.batch_clients} connections)"
    )
    rounds = ", ".join(
        f"{b:,.0f}/{h:,.0f} ({h / b:.2f})" for b, h in zip(base_runs, http_runs, strict=True)
    )
    print(f"rounds (in-process/http rows/s): {rounds}")
    print(
        "CPU per row (less sensitive to other load): in-process "
        f"{cpu_us['in-process']:.1f} us; http server {cpu_us['server']:.1f} us "
        f"+ client {cpu_us['client']:.1f} us"
    )
    print(
        f"single-row under {args.clients} clients: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
        f" ({len(conc) / seconds:,.0f} req/s)"
    )
    print(
        f"batch-1 sequential: http p50 {statistics.median(seq) * 1e3:.3f} ms, "
        f"added over in-process {added * 1e3:.3f} ms"
    )
    print(
        f"BENCH serving ratio={ratio:.3f} ours={http_rows_s:.0f} baseline={base_rows_s:.0f} "
        f"p50_ms={p50 * 1e3:.3f} p99_ms={p99 * 1e3:.3f} added_b1_ms={added * 1e3:.3f} "
        f"batch={args.batch} clients={args.clients} rounds={args.rounds} "
        f"cpu_ratio={cpu_us['in-process'] / (cpu_us['server'] + cpu_us['client']):.3f}"
    )  # fmt: skip


if __name__ == "__main__":
    main()
