"""The serving server under hostile clients: a real ``trainyard serve`` process, real sockets.

* A connection that never completes its request head (silent, partial, or one byte at a
  time) is closed after ``--header-timeout``; a body that does not arrive within
  ``--body-timeout`` gets 408 and its connection is closed; good requests, and idle
  keep-alive connections, are unaffected; a client that stops reading its response is
  closed after ``--send-timeout``.
* Under ``ulimit -n 1024``, 1,100 half-open connections (and more arriving) do not keep
  good requests from being answered: the server keeps its connections below the limit by
  closing the longest idle one (the head deadline is set long here so that the cap alone
  has to do it). The same with 1,100 idle gRPC connections: REST and gRPC clients, new
  and connected before, are still answered.
* Beyond ``--max-connections``, the longest idle connection is closed, never one whose
  request is in progress.
* Large requests (12 concurrent 40,000-row ones, then 50,000-row ones in a row) leave the
  server's resident memory near its baseline.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import trainyard
from tests.support.ports import free_port
from tests.support.serving import IMAGE_SPEC, ThreadedServer, build_image_model
from trainyard.serving.client import ServingClient
from trainyard.serving.deploy import publish_version

PLUGINS = Path(trainyard.__file__).resolve().parents[1]
PREDICT = "/v1/models/digits:predict"
GOOD_BODY = json.dumps({"instances": np.zeros((2, 8, 8, 1)).tolist()}).encode()


class ServerProcess:
    """``python -m trainyard serve`` on a free port, serving digits v1, stopped on exit."""

    def __init__(self, root: Path, model: Path, *flags: str, nofile: int | None = None) -> None:
        self.base = root / "serving"
        publish_version(model, self.base, "digits", 1, IMAGE_SPEC)
        self.port = free_port()
        self.log = root / "server.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }

        def limit_open_files() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        cmd = [
            sys.executable, "-m", "trainyard", "serve", "--base-path", str(self.base),
            "--port", str(self.port), "--poll-interval", "2", *flags,
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=limit_open_files
            )
        deadline = time.monotonic() + 120
        with ServingClient("127.0.0.1", self.port, timeout=10) as client:
            while True:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                with contextlib.suppress(Exception):
                    if client.status("digits")[0]["state"] == "AVAILABLE":
                        break
                assert time.monotonic() < deadline, self.log.read_text()[-3000:]
                time.sleep(0.3)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_image_model(tmp_path_factory.mktemp("model") / "digits")


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[ServerProcess]:
    """A server with 1 s head, 3 s body and 3 s send deadlines and at most 50,000 rows."""
    server = ServerProcess(
        tmp_path_factory.mktemp("strict"),
        model,
        *("--header-timeout", "1", "--body-timeout", "3", "--send-timeout", "3"),
        *("--max-rows", "50000"),
    )
    yield server
    server.stop()


def good_request(port: int, timeout: float = 10.0) -> tuple[int, float]:
    """One predict on a fresh connection: (status, seconds)."""
    start = time.monotonic()
    with ServingClient("127.0.0.1", port, timeout=timeout) as client:
        status, data = client.request("POST", PREDICT, GOOD_BODY)
    if status == 200:
        assert len(json.loads(data)["predictions"]) == 2
    return status, time.monotonic() - start


def closed_after(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading and discarding), None if it does not."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < within:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
    return None


def test_incomplete_request_heads_are_closed_after_the_header_timeout(strict: ServerProcess):
    port = strict.port
    keepalive = ServingClient("127.0.0.1", port, timeout=10)
    assert keepalive.predict("digits", instances=np.zeros((1, 8, 8, 1)).tolist())
    silent = socket.create_connection(("127.0.0.1", port))
    partial = socket.create_connection(("127.0.0.1", port))
    partial.sendall(b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n")
    drip = socket.create_connection(("127.0.0.1", port))
    stop = threading.Event()

    def drip_head() -> None:  # a byte every 0.2 s: active, but never a complete head
        for byte in b"GET /v1/models/digits HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
            if stop.wait(0.2):
                return
            with contextlib.suppress(OSError):
                drip.send(bytes([byte]))

    dripper = threading.Thread(target=drip_head, daemon=True)
    dripper.start()
    try:
        for _ in range(3):
            status, seconds = good_request(port)
            assert status == 200
            assert seconds < 5
        for sock in (silent, partial, drip):
            waited = closed_after(sock, within=8)
            assert waited is not None, "an incomplete request head was not closed in 8 s"
        # A keep-alive connection idle past the head deadline still works.
        assert keepalive.predict("digits", instances=np.zeros((1, 8, 8, 1)).tolist())
    finally:
        stop.set()
        for sock in (silent, partial, drip):
            sock.close()
        keepalive.close()
        dripper.join(5)


def test_slow_body_gets_408_and_its_connection_is_closed(strict: ServerProcess):
    port = strict.port
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(
        b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + GOOD_BODY[:20]
    )
    stop = threading.Event()

    def drip_body() -> None:
        while not stop.wait(0.3):
            with contextlib.suppress(OSError):
                slow.send(b" ")

    dripper = threading.Thread(target=drip_body, daemon=True)
    dripper.start()
    start = time.monotonic()
    try:
        status, seconds = good_request(port)
        assert status == 200
        assert seconds < 5
        slow.settimeout(10)
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := slow.recv(65536):
                received += chunk
        elapsed = time.monotonic() - start
        assert received.startswith(b"HTTP/1.1 408 "), received[:200]
        assert b"request body not received within 3 s" in received
        assert elapsed < 8, f"the slow body's connection stayed open {elapsed:.1f} s"
        assert good_request(port)[0] == 200
    finally:
        stop.set()
        slow.close()
        dripper.join(5)


@pytest.mark.slow
def test_half_open_flood_does_not_starve_good_requests(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3000:
        pytest.skip(f"the flood needs ~1,500 open files in the test process (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 3000), hard))
    try:
        # The head deadline is longer than the test: the connection cap alone must hold.
        server = ServerProcess(tmp_path, model, "--header-timeout", "120", nofile=1024)
        flood: list[socket.socket] = []
        try:

            def open_half(n: int) -> None:
                for i in range(n):
                    s = socket.socket()
                    s.settimeout(0.5)
                    with contextlib.suppress(OSError):
                        s.connect(("127.0.0.1", server.port))
                        if i % 2:
                            s.send(b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n")
                    flood.append(s)

            open_half(1100)
            time.sleep(1.0)
            latencies = []
            for _ in range(10):
                open_half(50)  # the flood goes on between the good requests
                status, seconds = good_request(server.port, timeout=15)
                assert status == 200
                latencies.append(seconds)
            assert max(latencies) < 5, f"good request latencies {latencies}"
            assert server.proc.poll() is None
            log = server.log.read_text()
            assert "Too many open files" not in log
            assert "closing the longest idle" in log
        finally:
            for s in flood:
                s.close()
            server.stop()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _grpc_predict(channel: object, timeout: float = 15.0) -> int:
    """One gRPC Predict of two zero images; the number of classes answered."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(np.zeros((2, 8, 8, 1), np.float32)))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(request, timeout=timeout, wait_for_ready=True)
    return len(tf.make_ndarray(response.outputs["class_id"]))


# An HTTP/2 client's first bytes: the preface, then an empty SETTINGS frame.
H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.mark.slow
def test_idle_grpc_flood_locks_out_neither_rest_nor_grpc(tmp_path: Path, model: Path):
    """1,100 idle gRPC connections under ``ulimit -n 1024`` (issue 34, outcome 3).

    Half are silent, half have said hello as an HTTP/2 client would and then idle. Before
    gRPC shared the REST listener's cap, they took every file descriptor: REST and gRPC
    clients both were turned away.
    """
    import grpc

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3000:
        pytest.skip(f"the flood needs ~1,500 open files in the test process (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 3000), hard))
    gport = free_port()
    server = ServerProcess(
        tmp_path, model, "--header-timeout", "120", "--grpc-port", str(gport), nofile=1024
    )
    flood: list[socket.socket] = []
    early = grpc.insecure_channel(f"127.0.0.1:{gport}")
    try:
        assert _grpc_predict(early) == 2

        def open_idle(n: int) -> None:
            for i in range(n):
                s = socket.socket()
                s.settimeout(0.5)
                with contextlib.suppress(OSError):
                    s.connect(("127.0.0.1", gport))
                    if i % 2:
                        s.send(H2_HELLO)
                flood.append(s)

        open_idle(1100)
        time.sleep(1.0)
        latencies = []
        for _ in range(10):
            open_idle(50)  # the flood goes on between the good requests
            start = time.monotonic()
            assert good_request(server.port, timeout=15)[0] == 200
            with grpc.insecure_channel(f"127.0.0.1:{gport}") as fresh:
                assert _grpc_predict(fresh) == 2
            assert _grpc_predict(early) == 2  # reconnects if the cap closed it while idle
            latencies.append(time.monotonic() - start)
        assert max(latencies) < 10, f"REST + 2 gRPC latencies {latencies}"
        assert server.proc.poll() is None
        log = server.log.read_text()
        assert "Too many open files" not in log
        assert "closing the longest idle" in log
    finally:
        early.close()
        for s in flood:
            s.close()
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_grpc_connections_have_the_head_deadline_and_idle_timeout_of_rest(
    tmp_path: Path, model: Path
):
    """A silent gRPC connection is closed at the head deadline; one that said hello and made
    no call, at the idle timeout (the gRPC server's GOAWAY); a channel with calls works."""
    import grpc

    base = tmp_path / "serving"
    publish_version(model, base, "digits", 1, IMAGE_SPEC)
    srv = ThreadedServer(
        base, poll_interval=3600, grpc_port=0, header_timeout=1, keepalive_timeout=3
    )
    try:
        srv.sync()
        gport = srv.server.grpc_port
        silent = socket.create_connection(("127.0.0.1", gport))
        hello = socket.create_connection(("127.0.0.1", gport))
        hello.sendall(H2_HELLO)
        waited = closed_after(silent, within=5)
        assert waited is not None and waited < 3, waited
        waited = closed_after(hello, within=10)
        assert waited is not None and 1.5 < waited < 8, waited
        with grpc.insecure_channel(f"127.0.0.1:{gport}") as channel:
            assert _grpc_predict(channel) == 2
            time.sleep(4)  # idle past the timeout: closed, and the channel reconnects
            assert _grpc_predict(channel) == 2
        assert srv.server.guard.timed_out >= 1
    finally:
        srv.stop()


def test_connection_cap_closes_the_longest_idle_and_never_a_request_in_progress(
    tmp_path: Path, model: Path
):
    base = tmp_path / "serving"
    publish_version(model, base, "digits", 1, IMAGE_SPEC)
    srv = ThreadedServer(base, poll_interval=3600, max_connections=4, header_timeout=60)
    sockets: list[socket.socket] = []
    try:
        srv.sync()
        busy = socket.create_connection(("127.0.0.1", srv.port))
        sockets.append(busy)
        busy.sendall(
            b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Length: {len(GOOD_BODY)}\r\n\r\n".encode()
            + GOOD_BODY[:10]
        )
        idle = []
        for _ in range(6):
            time.sleep(0.2)  # the server sees them in this order
            idle.append(socket.create_connection(("127.0.0.1", srv.port)))
        sockets.extend(idle)
        time.sleep(0.2)
        status, _ = good_request(srv.port)
        assert status == 200
        # 4 allowed: each of idle[3], idle[4], idle[5] and the good request's connection
        # closed the longest idle one in turn; the request in progress stayed.
        for sock in idle[:4]:
            assert closed_after(sock, within=3) is not None
        for sock in idle[4:]:
            assert closed_after(sock, within=0.5) is None
        busy.sendall(GOOD_BODY[10:])
        busy.settimeout(10)
        assert busy.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert srv.server.guard.evicted == 4
    finally:
        for sock in sockets:
            sock.close()
        srv.stop()


def test_a_misbehaving_client_is_one_log_line_not_a_traceback(
    tmp_path: Path, model: Path, caplog: pytest.LogCaptureFixture
):
    """A cold user's run: a body cut short, a bad Content-Length or 300 headers each wrote
    aiohttp's 10-22 line ERROR traceback, so any client could flood the log."""
    import logging

    base = tmp_path / "serving"
    publish_version(model, base, "digits", 1, IMAGE_SPEC)
    srv = ThreadedServer(base, poll_interval=3600)
    heads = [
        b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{",
        b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(300)) + b"\r\n",
    ]
    try:
        srv.sync()
        with caplog.at_level(logging.INFO):
            for head in heads:
                with socket.create_connection(("127.0.0.1", srv.port)) as sock:
                    sock.sendall(head)
                    time.sleep(0.3)
            time.sleep(0.5)
            assert good_request(srv.port)[0] == 200
    finally:
        srv.stop()
    client_faults = [r for r in caplog.records if r.name in ("aiohttp.server", "trainyard.serving")]
    assert not [r for r in client_faults if r.exc_info], [r.getMessage() for r in client_faults]
    lines = [r.getMessage() for r in client_faults if r.levelno >= logging.WARNING]
    assert len(lines) == 3 and all("\n" not in line for line in lines), lines
    assert "ConnectionResetError" in lines[0] and "Content-Length" in lines[1], lines
    assert "Too many headers" in lines[2], lines


def test_connection_cap_below_the_clients_never_cuts_an_answered_keepalive_connection(
    tmp_path: Path, model: Path
):
    """Three keep-alive clients against ``max_connections=2`` (a cold user's run).

    The cap used to close a keep-alive connection between two of its requests (its next
    request already sent: reset) and one whose answer was still in the send buffer (a
    truncated body). Now only a newcomer is turned away: no connection that has answered
    a request is cut, and every answer arrives whole.
    """
    import http.client

    base = tmp_path / "serving"
    publish_version(model, base, "digits", 1, IMAGE_SPEC)
    srv = ThreadedServer(base, poll_interval=3600, max_connections=2)
    answered, cut, truncated, refused = [0], [], [], [0]
    lock = threading.Lock()

    def client() -> None:
        conn, on_conn = None, 0
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            if conn is None:
                conn, on_conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10), 0
            try:
                conn.request("POST", PREDICT, GOOD_BODY)
                resp = conn.getresponse()
                body = resp.read()
                assert resp.status == 200 and len(json.loads(body)["predictions"]) == 2
                on_conn += 1
                with lock:
                    answered[0] += 1
            except http.client.IncompleteRead as e:
                truncated.append(repr(e))
                conn.close()
                conn = None
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    if on_conn:
                        cut.append(f"after {on_conn} answers: {e!r}")
                    else:
                        refused[0] += 1
                conn.close()
                conn = None
                time.sleep(0.01)
        if conn is not None:
            conn.close()

    try:
        srv.sync()
        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert truncated == [] and cut == [], (truncated[:3], cut[:3])
        assert answered[0] > 50 and refused[0] > 0, (answered, refused)
    finally:
        srv.stop()


@pytest.mark.slow
def test_large_request_memory_returns_near_baseline(tmp_path: Path, model: Path):
    """What large requests leave resident, and that it does not grow request after request.

    Twelve concurrent 40,000-row requests: decoded all at once, their JSON took the server
    2.1 GB above its baseline and left 112 MB behind; one large body at a time
    (``server._off_loop``) it peaks 0.9 GB above (the bodies waiting, the model's own
    tensors) and keeps about 40 MB. Then 50,000-row requests in a row: before
    the allocator tuning (``trainyard.serving.memory``) each left 40-100 MB behind; now the
    heap keeps 10-30 MB that ``malloc_trim`` cannot return, at a level that moves within that
    band from one request to the next (+11, +19, +13, +21 in one CI run). Four are sent, and
    none may leave 40 MB or more above the baseline: less than one request left before the
    tuning, and more than any residue in the band, so a leak of 8 MB a request crosses it
    within the four. A step from one request to the next says nothing: the band is that wide.

    The server has the default deadlines: under a busy ``make test`` one of the twelve bodies
    took the strict server more than its 3 s to read (408), and the assertion in its thread
    went unseen; each client's answer is now checked here.
    """
    server = ServerProcess(tmp_path / "roomy", model, "--max-rows", "50000")
    try:
        _large_requests(server)
    finally:
        server.stop()


def _large_requests(server: ServerProcess) -> None:
    images = np.round(np.random.default_rng(5).random((50_000, 8, 8, 1)), 2)
    with ServingClient("127.0.0.1", server.port, timeout=60) as client:
        for _ in range(5):
            client.predict("digits", instances=images[:4].tolist())
    time.sleep(1.0)
    baseline = server.rss_mb()
    concurrent = json.dumps({"instances": images[:40_000].tolist()}).encode()
    peak, stop = [baseline], threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], server.rss_mb())

    answers: list[tuple[int, int]] = []

    def one() -> None:
        with ServingClient("127.0.0.1", server.port, timeout=900) as c:
            status, data = c.request("POST", PREDICT, concurrent)
            rows = len(json.loads(data).get("predictions", [])) if status == 200 else 0
            answers.append((status, rows))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    clients = [threading.Thread(target=one) for _ in range(12)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(900)
    stop.set()
    watcher.join(5)
    assert answers == [(200, 40_000)] * 12, answers
    time.sleep(2.0)  # the trim runs 0.2 s after the answer
    kept = server.rss_mb() - baseline
    assert kept < 60, f"RSS {baseline:.0f} MB before 12 concurrent requests, then +{kept:.0f}"
    assert peak[0] - baseline < 1500, f"peak {peak[0]:.0f} MB from {baseline:.0f}"

    rows = 50_000
    body = json.dumps({"instances": images.tolist()}).encode()
    assert len(body) < 32 * 2**20  # within the default body limit
    with ServingClient("127.0.0.1", server.port, timeout=60) as client:
        time.sleep(1.0)
        baseline = server.rss_mb()
        after = []
        for _ in range(4):
            status, data = client.request("POST", PREDICT, body)
            assert status == 200
            assert len(json.loads(data)["predictions"]) == rows
            del data
            time.sleep(2.0)  # the trim runs 0.2 s after the answer
            after.append(server.rss_mb())
    grown = ", ".join(f"{a - baseline:+.0f}" for a in after)
    assert max(after) - baseline < 40, f"RSS {baseline:.0f} MB before, then {grown} MB"


ZERO_ROW = b"[" + b",".join([b"[" + b",".join([b"[0]"] * 8) + b"]"] * 8) + b"]"


def test_client_that_stops_reading_is_closed_after_the_send_timeout(strict: ServerProcess):
    body = b'{"instances":[' + b",".join([ZERO_ROW] * 50_000) + b"]}"  # an 8 MB answer
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", strict.port))
    try:
        reader.sendall(
            b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # reads nothing: once the answer starts to arrive (decoding 50,000 rows takes a
        # while), the server gives up 3 s after the client's buffers fill
        assert select.select([reader], [], [], 300)[0], "no answer within 300 s"
        time.sleep(7)
        assert good_request(strict.port)[0] == 200
        reader.settimeout(10)
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := reader.recv(1 << 20):
                received += chunk
    finally:
        reader.close()
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head[:200]
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert len(rest) < length, "the whole answer waited for a client that stopped reading"


def test_max_rows_flag_limits_the_rows_of_one_request(strict: ServerProcess):
    row = ZERO_ROW
    with ServingClient("127.0.0.1", strict.port, timeout=60) as client:
        body = b'{"instances":[' + b",".join([row] * 50_001) + b"]}"
        status, data = client.request("POST", PREDICT, body)
        assert status == 400
        assert "request has 50001 rows, at most 50000 are allowed" in json.loads(data)["error"]
        status, data = client.request("POST", PREDICT, b'{"instances":[' + row + b"]}")
        assert status == 200
