"""Serving benchmark: the latency the local server adds at batch 1, over REST and gRPC.

The local server is TF Serving's stand-in on a laptop: its goal is at most 1 ms added at
batch 1 (issue 35), not throughput. In one run, against a real ``trainyard serve`` process
with ``--grpc-port``:

* baseline: the same SavedModel's ``serving_default`` called in this process on one row,
  its outputs fetched to numpy, with the server's TensorFlow thread settings (one thread
  per op, one op per core): what any server has to spend;
* REST: one keep-alive connection posting one row (``{"instances": [...]}``, encoded once)
  and reading the answer (a plain socket client, so that Python's ``http.client`` does not
  count as the server's);
* gRPC: one channel calling ``PredictionService.Predict`` with the stock stubs (request
  built once, answer turned into numpy: the stubs' own cost is in the figure).

Requests are sequential, one at a time. The three are measured in alternating rounds, so
load from other processes hits all alike; each round's added latency is its p50 (p99)
minus the baseline's p50 (p99) in the same round, and the run reports the median over
rounds. The model is the digits pipeline's ``small_cnn`` shape (conv 32 → pool → conv 64 →
dense 64 → 10) with random weights, on 8x8x1 images. The load average is printed with the
figures (the machine may be shared). Last line::

    BENCH serving ratio=<REST p50 / in-process p50> added_p50_ms=<n> added_p99_ms=<n>
    grpc_ratio=<n> grpc_added_p50_ms=<n> grpc_added_p99_ms=<n> base_p50_ms=<n> ...
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from trainyard.cpus import usable_cores  # noqa: E402
from trainyard.serving.client import ServingClient  # noqa: E402
from trainyard.serving.deploy import publish_version, wait_available  # noqa: E402
from trainyard.serving.model_config import ensure_config, set_served  # noqa: E402
from trainyard.serving.versions import configure_tf_threads  # noqa: E402

SPEC = {"image": ("float32", (None, 8, 8, 1))}


def build_model(path: Path) -> None:
    """Save the benchmark's model (the digits ``small_cnn`` shape, random weights)."""
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RestCaller:
    """A keep-alive HTTP/1.1 connection that posts one pre-encoded request and reads the answer.

    Args:
        port: The server's REST port.
        body: The JSON body to post.
    """

    def __init__(self, port: int, body: bytes) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._request = (
            b"POST /v1/models/bench:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self._buffer = b""

    def __call__(self) -> dict:
        """One request; its decoded answer."""
        self._sock.sendall(self._request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._recv()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"request failed: {head[:200]!r}")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += self._recv()
        self._buffer = rest[length:]
        return orjson.loads(rest[:length])

    def _recv(self) -> bytes:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise SystemExit("the server closed the connection")
        return chunk

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()


def grpc_caller(port: int, row: np.ndarray) -> tuple[Callable[[], dict], Callable[[], None]]:
    """A ``Predict`` of ``row`` on one channel, and the channel's ``close``."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "bench"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(row))

    def call() -> dict:
        response = stub.Predict(request, timeout=30)
        return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}

    return call, channel.close


def in_process_caller(fn: Callable, row: np.ndarray) -> Callable[[], dict]:
    """The signature called on ``row`` with its outputs fetched to numpy."""
    import tensorflow as tf

    def call() -> dict:
        return {k: v.numpy() for k, v in fn(image=tf.constant(row)).items()}

    return call


def latencies(call: Callable[[], object], n: int) -> list[float]:
    """Seconds each of ``n`` sequential calls took."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def p(values: list[float], q: float) -> float:
    """The ``q``-th percentile, in ms."""
    return float(np.percentile(values, q)) * 1e3


def start_server(root: Path, port: int, grpc_port: int, log: Path) -> subprocess.Popen:
    """``trainyard serve`` on ``root``'s model config, REST and gRPC, once ``bench`` loads."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    cmd = [
        sys.executable, "-m", "trainyard", "serve", "--base-path", str(root),
        "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
        "--model-config-file", str(ensure_config(root)), "--poll-interval", "0.5",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    t_end = time.monotonic() + 180
    while True:
        try:
            with ServingClient("127.0.0.1", port) as c:
                wait_available(c, "bench", 1, 180)
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > t_end:
                proc.kill()
                raise SystemExit("server did not start: " + log.read_text()[-2000:]) from None
            time.sleep(0.5)


def main() -> None:
    """Run the benchmark and print its figures, the ``BENCH`` line last."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500, help="calls per side and round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    ap.add_argument("--quick", action="store_true", help="3 rounds of 200 calls")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests = 3, 200
    row = np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)
    # this process's TensorFlow threads as `trainyard serve` sets its own by default (before
    # any op runs): one thread per op, one op per core
    assert configure_tf_threads(1, usable_cores()), "TensorFlow started before the benchmark"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        tmp_path = Path(tmp)
        build_model(tmp_path / "model")
        root = tmp_path / "serving"
        publish_version(tmp_path / "model", root, "bench", 1, SPEC)
        set_served(root, "bench", [1], {"stable": 1})
        port, grpc_port = _free_port(), _free_port()
        proc = start_server(root, port, grpc_port, tmp_path / "server.log")
        rest = RestCaller(port, orjson.dumps({"instances": row.tolist()}))
        grpc_call, grpc_close = grpc_caller(grpc_port, row)
        try:
            import gc

            import tensorflow as tf

            fn = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
            gc.collect()
            gc.freeze()  # as the server does: keep full collections off TensorFlow's objects
            local = in_process_caller(fn, row)
            want = local()["class_id"].tolist()
            assert rest()["predictions"][0]["class_id"] == want[0], "REST answers differently"
            assert grpc_call()["class_id"].tolist() == want, "gRPC answers differently"
            for call in (local, rest, grpc_call):
                latencies(call, 50)  # warm: traced, connected, caches filled
            sides = {"in-process": local, "rest": rest, "grpc": grpc_call}
            runs: dict[str, list[list[float]]] = {k: [] for k in sides}
            for _ in range(args.rounds):
                for name, call in sides.items():
                    runs[name].append(latencies(call, args.requests))
        finally:
            rest.close()
            grpc_close()
            proc.terminate()
            proc.wait(30)
    load_after = os.getloadavg()

    def per_round(name: str, q: float) -> list[float]:
        return [p(r, q) for r in runs[name]]

    base50, base99 = per_round("in-process", 50), per_round("in-process", 99)
    med = statistics.median
    figures = {}
    for name in ("rest", "grpc"):
        ours50, ours99 = per_round(name, 50), per_round(name, 99)
        figures[name] = {
            "p50": med(ours50),
            "p99": med(ours99),
            "added50": med(o - b for o, b in zip(ours50, base50, strict=True)),
            "added99": med(o - b for o, b in zip(ours99, base99, strict=True)),
            "ratio": med(o / b for o, b in zip(ours50, base50, strict=True)),
            "rounds": ", ".join(f"{o - b:.3f}" for o, b in zip(ours50, base50, strict=True)),
        }
    load = f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (1-min load average)"
    print(f"{args.rounds} rounds of {args.requests} sequential batch-1 calls per side; load {load}")
    print(f"in-process: p50 {med(base50):.3f} ms, p99 {med(base99):.3f} ms")
    for name, label in (("rest", "REST"), ("grpc", "gRPC")):
        f = figures[name]
        print(
            f"{label}: p50 {f['p50']:.3f} ms, p99 {f['p99']:.3f} ms; added p50 "
            f"{f['added50']:.3f} ms (rounds: {f['rounds']}), added p99 {f['added99']:.3f} ms"
        )
    r, g = figures["rest"], figures["grpc"]
    print(
        f"BENCH serving ratio={r['ratio']:.3f} added_p50_ms={r['added50']:.3f} "
        f"added_p99_ms={r['added99']:.3f} grpc_ratio={g['ratio']:.3f} "
        f"grpc_added_p50_ms={g['added50']:.3f} grpc_added_p99_ms={g['added99']:.3f} "
        f"base_p50_ms={med(base50):.3f} rounds={args.rounds} requests={args.requests} "
        f"load1={load_before[0]:.2f}"
    )


if __name__ == "__main__":
    main()
