"""Serving benchmark, gRPC: ``PredictionService.Predict`` on loopback vs in-process calls.

The gRPC side of ``benchmarks/serving.py``, with the same model (the digits pipeline's
``small_cnn`` shape, random weights, 8x8x1 images) and the same method: a real
``trainyard serve --grpc-port`` process; rows/s of batched ``Predict`` calls (``--batch``
rows each, ``--batch-clients`` threads on one channel, request protos built once,
responses turned into numpy) against rows/s of the same batches through
``signatures["serving_default"]`` in this process, in alternating rounds (``ratio`` is the
median of the per-round ratios); CPU per row of each side (``cpu_ratio``: in-process over
server plus client); the latency added at batch 1 (one client, p50 minus in-process p50).
Last line: ``BENCH serving_grpc ratio=<grpc/in-process> ours=<rows/s> baseline=<rows/s>
... cpu_ratio=<n>``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from serving import (  # noqa: E402
    _cpu,
    add_common_args,
    in_process_p50,
    in_process_rows_s,
    publish_bench_model,
)

from trainyard.serving.client import ServingClient  # noqa: E402
from trainyard.serving.deploy import wait_available  # noqa: E402
from trainyard.serving.model_config import ensure_config  # noqa: E402


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def grpc_load(
    port: int,
    batch: np.ndarray,
    clients: int,
    seconds: float,
    procs: tuple[psutil.Process, ...] = (),
) -> tuple[float, list[float], list[float]]:
    """``clients`` threads calling ``Predict`` repeatedly, after one unmeasured call.

    Returns:
        rows/s, per-call latencies, and the CPU seconds each of ``procs`` used per row
        answered, counted from the first measured call to the last answer.
    """
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "bench"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(batch))
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    with grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 * 2**20)]
    ) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        stub.Predict(request, timeout=60)

        def run(i: int) -> None:
            start.wait()
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end:
                t = time.perf_counter()
                reply = stub.Predict(request, timeout=60)
                rows = len(tf.make_ndarray(reply.outputs["class_id"]))
                lat[i].append(time.perf_counter() - t)
                if rows != len(batch):
                    errors.append(f"{rows} rows answered for {len(batch)}")
                    break

        threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        c0 = [_cpu(p) for p in procs]
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        used = [_cpu(p) - c for p, c in zip(procs, c0, strict=True)]
    if errors:
        raise SystemExit(f"Predict failed: {errors[0]}")
    flat = [x for per in lat for x in per]
    rows = len(flat) * len(batch)
    return rows / elapsed, flat, [u / rows for u in used]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    args = p.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    if args.quick:
        args.rounds = 3
    port, grpc_port = _free_port(), _free_port()

    rng = np.random.default_rng(0)
    batch = rng.random((args.batch, 8, 8, 1), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="bench-serving-grpc-") as tmp:
        tmp_path = Path(tmp)
        root = publish_bench_model(tmp_path)
        cmd = [
            sys.executable, "-m", "trainyard", "serve", "--base-path", str(root),
            "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
            "--model-config-file", str(ensure_config(root)), "--poll-interval", "0.5",
        ]  # fmt: skip
        log = (tmp_path / "server.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            t_end = time.monotonic() + 120
            while True:
                try:
                    with ServingClient("127.0.0.1", port) as c:
                        wait_available(c, "bench", 1, 120)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > t_end:
                        raise SystemExit(
                            "server did not start: " + (tmp_path / "server.log").read_text()[-2000:]
                        ) from None
                    time.sleep(0.5)
            import gc

            import tensorflow as tf

            fn = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
            gc.collect()
            gc.freeze()
            in_process_rows_s(fn, batch, 0.5)

            base_runs, grpc_runs = [], []
            server, me = psutil.Process(proc.pid), psutil.Process()
            cpu = {"in-process": 0.0, "server": 0.0, "client": 0.0}
            for _ in range(args.rounds):
                m0 = _cpu(me)
                rows_s, computed = in_process_rows_s(fn, batch, seconds)
                base_runs.append(rows_s)
                cpu["in-process"] += (_cpu(me) - m0) / computed
                rows_s, _, (server_cpu, client_cpu) = grpc_load(
                    grpc_port, batch, args.batch_clients, seconds, (server, me)
                )
                grpc_runs.append(rows_s)
                cpu["server"] += server_cpu
                cpu["client"] += client_cpu
            cpu_us = {k: v / args.rounds * 1e6 for k, v in cpu.items()}
            ratio = statistics.median(g / b for b, g in zip(base_runs, grpc_runs, strict=True))
            base_p50_b1 = in_process_p50(fn, batch[:1], seconds)
            _, seq, _ = grpc_load(grpc_port, batch[:1], 1, seconds / 2)
            added = statistics.median(seq) - base_p50_b1
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
    rounds = ", ".join(
        f"{b:,.0f}/{g:,.0f} ({g / b:.2f})" for b, g in zip(base_runs, grpc_runs, strict=True)
    )
    print(f"rounds (in-process/gRPC rows/s at batch {args.batch}): {rounds}")
    print(
        "CPU per row: in-process "
        f"{cpu_us['in-process']:.1f} us; gRPC server {cpu_us['server']:.1f} us "
        f"+ client {cpu_us['client']:.1f} us"
    )
    print(
        f"batch-1 sequential: gRPC p50 {statistics.median(seq) * 1e3:.3f} ms, "
        f"added over in-process {added * 1e3:.3f} ms"
    )
    print(
        f"BENCH serving_grpc ratio={ratio:.3f} ours={statistics.median(grpc_runs):.0f} "
        f"baseline={statistics.median(base_runs):.0f} added_b1_ms={added * 1e3:.3f} "
        f"batch={args.batch} rounds={args.rounds} "
        f"cpu_ratio={cpu_us['in-process'] / (cpu_us['server'] + cpu_us['client']):.3f}"
    )  # fmt: skip


if __name__ == "__main__":
    main()
