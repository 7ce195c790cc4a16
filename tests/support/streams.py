"""A small stream-scoring project for tests and the benchmark: contract, pipeline, models.

The dataset ``events`` has a string key ``id``, two float features ``a`` and ``b`` (``a``
within [0, 100]) and a label; the models are ``tests.support.serving.build_table_model``'s
(class 1 when a > b) and its mirror image (class 1 when a < b), so a test can tell from a
score which version computed it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.serving import build_table_model

CONTRACT = """\
dataset: events
version: 1.0.0
owner: tests@example.com
source: {format: jsonl}
columns:
  - {name: id, type: string, nullable: false, regex: "^ev-[0-9]+$", max_length: 32}
  - {name: a, type: float64, nullable: false, min: 0, max: 100}
  - {name: b, type: float64, nullable: false}
  - {name: label, type: int64, nullable: true, allowed_values: [0, 1]}
roles: {key: id, label: label, features: [a, b], num_classes: 2}
split: {holdout_fraction: 0.2, by: id}
"""

LOOSE_CONTRACT = """\
dataset: loose
version: 1.0.0
owner: tests@example.com
source: {format: jsonl}
allow_extra_columns: true
columns:
  - {name: id, type: string, nullable: false, min_length: 2, max_length: 8, regex: "^t-"}
  - {name: x, type: float32, nullable: false, min: -2, max: 9007199254740992, max_exclusive: true}
  - {name: n, type: int64, nullable: false, min: 0, allowed_values: [0, 1, 2, 3]}
  - {name: flag, type: bool, nullable: false}
  - {name: day, type: timestamp, nullable: true, severity: {nullable: warn}}
  - {name: y, type: int32, nullable: true}
  - {name: w, type: int32, nullable: true, max: 10000000000}
roles: {key: id, label: y, features: [x, n, flag], num_classes: 2}
split: {holdout_fraction: 0.2, by: id}
"""
"""A contract that allows extra fields, with a rule of each kind the record checks take
(lengths, a regex, bounds up to 2**53, allowed values, a bool feature, int32 columns)."""

PIPELINE = """\
name: events
dataset: events
start_date: 2026-11-01
source: {{url: events.jsonl, format: jsonl}}
training: {{model: mlp}}
serving: {{model_name: events, port: {port}}}
scoring:
  stream: {{input: events.in, output: events.scores, dead_letter: events.dead}}
  batch_size: {batch_size}
  max_in_flight: {max_in_flight}
  claim_idle_s: {claim_idle_s}
"""

SPEC = {"a": ("float32", (None,)), "b": ("float32", (None,))}


def write_project(
    root: Path,
    port: int,
    *,
    batch_size: int = 256,
    max_in_flight: int = 2,
    claim_idle_s: float = 2.0,
) -> dict[str, str]:
    """Write the contract and pipeline below ``root``; the environment that points at them."""
    (root / "contracts").mkdir(parents=True, exist_ok=True)
    (root / "pipelines").mkdir(parents=True, exist_ok=True)
    (root / "contracts" / "events.yaml").write_text(CONTRACT)
    (root / "pipelines" / "events.yaml").write_text(
        PIPELINE.format(
            port=port,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            claim_idle_s=claim_idle_s,
        )
    )
    import shutil

    schema = Path(__file__).resolve().parents[2] / "data_contracts" / "contract.schema.json"
    shutil.copy(schema, root / "contracts" / "contract.schema.json")
    return {
        "TRAINYARD_CONTRACTS_DIR": str(root / "contracts"),
        "TRAINYARD_PIPELINES_DIR": str(root / "pipelines"),
        "TRAINYARD_VOLUME_ROOT": str(root / "volumes"),
        "TRAINYARD_REDIS_DIR": str(root / "redis"),
    }


def build_mirror_model(path: Path) -> Path:
    """Like ``build_table_model`` but class 1 when a < b."""
    return build_table_model(path, mirror=True)


def build_models(folder: Path) -> tuple[Path, Path]:
    """Both SavedModels, built in a child process (keeps TensorFlow out of the test's)."""
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]]\n"
        "from pathlib import Path\n"
        "from tests.support.serving import build_table_model\n"
        "from tests.support.streams import build_mirror_model\n"
        "build_table_model(Path(sys.argv[2]) / 'gt')\n"
        "build_mirror_model(Path(sys.argv[2]) / 'lt')\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parents[2]), str(folder)],
        check=True,
        env=env,
    )
    return folder / "gt", folder / "lt"


def make_records(n: int, bad_every: int = 0, seed: int = 0) -> tuple[list[bytes], set[str]]:
    """``n`` JSON records ``ev-<i>``; every ``bad_every``-th breaks the contract.

    Returns:
        The records and the ids of the bad ones.
    """
    import orjson

    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 100, n)
    b = rng.uniform(0, 100, n)
    out, bad = [], set()
    breakers = [
        lambda r: r.update(a=-5.0),  # below the minimum
        lambda r: r.pop("b"),  # missing feature
        lambda r: r.update(b="high"),  # wrong type
        lambda r: r.update(label=7),  # not an allowed value
        lambda r: r.update(colour="red"),  # unknown field
    ]
    for i in range(n):
        rec = {"id": f"ev-{i}", "a": float(a[i]), "b": float(b[i]), "label": int(a[i] > b[i])}
        if bad_every and i % bad_every == bad_every - 1:
            breakers[(i // bad_every) % len(breakers)](rec)
            bad.add(rec["id"])
        out.append(orjson.dumps(rec))
    return out, bad


class StallingProxy:
    """A loopback TCP proxy to a Redis Unix socket that can stop answering, or drip.

    ``mode`` is read for every chunk the server sends: ``"pass"`` forwards it, ``"silent"``
    swallows it (the client waits for a reply that never comes), ``"drip"`` forwards it a
    byte every ``drip_s`` seconds. What clients send always reaches Redis.
    """

    def __init__(self, unix_path: Path | str, drip_s: float = 0.3) -> None:
        import socket
        import threading

        self.unix_path, self.drip_s, self.mode = str(unix_path), drip_s, "pass"
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = [self._server]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self._server.getsockname()[1]}/0"

    def __enter__(self) -> StallingProxy:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for s in self._socks:
            _cut(s)
        for t in self._threads:
            t.join(5)

    def _spawn(self, target: Any, *args: Any) -> None:
        import threading

        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        import socket

        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.connect(self.unix_path)
            except OSError:
                return
            self._socks += [client, server]
            self._spawn(self._pump, client, server, False)
            self._spawn(self._pump, server, client, True)

    def _pump(self, src: Any, dst: Any, replies: bool) -> None:

        try:
            while not self._stop.is_set() and (chunk := src.recv(65536)):
                if not replies or self.mode == "pass":
                    dst.sendall(chunk)
                elif self.mode == "drip":
                    for byte in chunk:
                        if self._stop.wait(self.drip_s):
                            return
                        dst.sendall(bytes([byte]))
        except OSError:
            pass
        finally:
            _cut(dst)  # and so the other direction's thread, blocked on it, ends


def _cut(sock: Any) -> None:
    """Shut a socket down, then close it: the shutdown wakes a thread blocked on it."""
    import contextlib
    import socket

    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def slow_http_server(drip: bool, drip_s: float = 0.3) -> Any:
    """A context manager: the port of a loopback HTTP peer that never answers whole.

    It reads each request, then says nothing (``drip=False``) or sends a 200 answer a byte
    every ``drip_s`` seconds.
    """
    import contextlib
    import socket
    import threading

    @contextlib.contextmanager
    def serve() -> Any:
        srv = socket.create_server(("127.0.0.1", 0))
        stop = threading.Event()

        def one(conn: socket.socket) -> None:
            with conn:
                try:
                    conn.recv(65536)
                    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n" + b"{" * 200
                    for byte in answer if drip else b"":
                        if stop.wait(drip_s):
                            return
                        conn.sendall(bytes([byte]))
                    stop.wait(120)
                except OSError:
                    pass

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=one, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield srv.getsockname()[1]
        finally:
            stop.set()
            srv.close()

    return serve()
