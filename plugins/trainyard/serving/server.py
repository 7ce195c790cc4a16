"""TF-Serving-compatible REST server on aiohttp (``python -m trainyard serve``).

Endpoints, with TF Serving's JSON shapes and its error shape ``{"error": "..."}``:

* ``GET  /v1/models/{name}[/versions/{v}]``: version status.
* ``GET  /v1/models/{name}[/versions/{v}]/metadata``: the SavedModel's SignatureDefs.
* ``POST /v1/models/{name}[/versions/{v}]:predict``: row (``instances``) or columnar
  (``inputs``) format, checked against the input spec of the signature it names
  (``signature_name``, default ``serving_default``); strings and ``{"b64": ...}`` for
  string inputs, ``{"b64": ...}`` for string outputs named ``*_bytes``.
* ``POST /v1/models/{name}[/versions/{v}]:classify`` / ``:regress``: ``tf.Example``
  requests to a classify / regress signature (:mod:`trainyard.serving.classify_regress`).

``/labels/{label}`` may stand where ``/versions/{v}`` does: the version labels of the model
config file (``--model-config-file``), ``stable`` (the champion) and ``canary``. As in TF
Serving, a status request ignores the label (every version's status), and an unknown label
is a 400.

Models come from a base path watched by :class:`~trainyard.serving.versions.ModelRepository`.
aiohttp sets ``TCP_NODELAY`` on every accepted connection (``BaseProtocol.connection_made``),
so small responses are not held back by Nagle's algorithm; a test asserts the latency.
``trainyard serve`` runs on uvloop when it is installed. By default each TensorFlow op has
one thread (``--intra-op-threads 1``: concurrent model calls, not one call's ops, share the
cores, without the spinning of a shared op pool), and as many ops (``--inter-op-threads``)
and model calls (``--model-threads``) as cores run at once. Each request is one model
call: the server is TF Serving's stand-in on a laptop, built for conformance and little
added latency, not for throughput (it batches nothing across requests).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from trainyard import argtypes
from trainyard.cpus import usable_cores
from trainyard.errors import ServingError
from trainyard.serving.classify_regress import (
    decode_example_request,
    encode_classification,
    encode_regression,
    example_batch,
    example_input_name,
    missing_signature,
)
from trainyard.serving.http_guard import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    ConnectionGuard,
    GuardedRequestHandler,
    close_after_response,
    default_max_connections,
)
from trainyard.serving.memory import MemoryReleaser, tune_allocator
from trainyard.serving.schema import (
    CLASSIFY_METHOD,
    REGRESS_METHOD,
    FeatureSpec,
    InvalidRequest,
    decode_request,
    encode_predict_response,
    model_error,
    signature_not_found,
)
from trainyard.serving.versions import (
    LabelNotFound,
    LoadedVersion,
    ModelNotFound,
    ModelRepository,
    SignatureNotFound,
)

log = logging.getLogger("trainyard.serving")
T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_ROWS = 65536
# Bodies beyond this size are decoded off the event loop, and answers beyond this many
# values encoded off it, one large request at a time (see _off_loop).
_LARGE_BODY_BYTES = 1024 * 1024
_LARGE_ANSWER_VALUES = 16384
# Scanning the base path more often than this only burns a core.
MIN_POLL_INTERVAL = 0.05

_WHICH = r"(?:/versions/(?P<v>[^/:]+)|/labels/(?P<label>[^/:]+))?"
_GET_RE = re.compile(rf"^/v1/models/(?P<name>[^/:]+){_WHICH}(?P<meta>/metadata)?$")
_VERBS = ("predict", "classify", "regress")
_POST_RE = re.compile(rf"^/v1/models/(?P<name>[^/:]+){_WHICH}:(?P<verb>[A-Za-z]+)$")

REPO_KEY: web.AppKey[ModelRepository] = web.AppKey("repository", ModelRepository)
MAX_ROWS_KEY: web.AppKey[int] = web.AppKey("max_rows", int)
MAX_BODY_KEY: web.AppKey[int] = web.AppKey("max_body_bytes", int)
BODY_TIMEOUT_KEY: web.AppKey[float] = web.AppKey("body_timeout", float)
RELEASER_KEY: web.AppKey[MemoryReleaser] = web.AppKey("memory_releaser", MemoryReleaser)
LARGE_KEY: web.AppKey[asyncio.Semaphore] = web.AppKey("large_requests", asyncio.Semaphore)


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode(),
        content_type="application/json",
    )


def _json(obj: Any) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), content_type="application/json")


def _version(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidRequest(f"version must be a non-negative integer, got {raw!r}")
    return int(raw)


def _metadata(lv: LoadedVersion) -> dict[str, Any]:
    """TF Serving's REST metadata: the SavedModel's own SignatureDefs, printed as it does.

    Every signature (``__saved_model_init_op`` too), the graph's tensor names, empty
    fields included (``"defaults": {}``, ``"unknown_rank": false``), from ``saved_model.pb``.
    """
    from google.protobuf import json_format

    defs = {
        key: json_format.MessageToDict(
            sig, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )
        for key, sig in lv.signature_defs().items()
    }
    return {
        "model_spec": {"name": lv.model, "signature_name": "", "version": str(lv.version)},
        "metadata": {"signature_def": {"signature_def": defs}},
    }


async def _handle(request: web.Request) -> web.Response:
    repo = request.app[REPO_KEY]
    path = request.path
    try:
        if request.method == "GET":
            m = _GET_RE.match(path)
            if not m:
                return _error(400, f"Malformed request: GET {path}")
            name = m["name"]
            if m["meta"]:
                return _json(_metadata(repo.get(name, *_which(m))))
            # TF Serving's status reads a version, never a label (get_model_status_impl.cc):
            # /labels/<any> answers every version's status
            return _json({"model_version_status": repo.status(name, _version(m["v"]))})
        if request.method == "POST":
            m = _POST_RE.match(path)
            if not m:
                return _error(400, f"Malformed request: POST {path}")
            if m["verb"] not in _VERBS:
                return _error(
                    400, f"unsupported method {m['verb']!r}: use :predict, :classify or :regress"
                )
            lv = repo.get(m["name"], *_which(m))
            return await _predict(request, lv, m["verb"])
        return _error(405, f"Malformed request: {request.method} {path} (use GET or POST)")
    except (InvalidRequest, SignatureNotFound, LabelNotFound) as e:
        return _error(400, str(e))
    except ModelNotFound as e:
        return _error(404, str(e))


def _which(m: re.Match[str]) -> tuple[int | None, str | None]:
    """``(version, label)`` a path names: ``/versions/<n>``, ``/labels/<label>`` or neither."""
    return _version(m["v"]), m["label"]


async def _predict(request: web.Request, lv: LoadedVersion, verb: str) -> web.Response:
    length = request.content_length
    limit = request.app[MAX_BODY_KEY]
    if length is not None and length > limit:
        return _error(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
    deadline = request.app[BODY_TIMEOUT_KEY]
    try:
        async with asyncio.timeout(deadline):
            body = await _read_body(request, limit)
    except TimeoutError:
        close_after_response(request)
        return _error(408, f"request body not received within {deadline:g} s")
    if body is None:
        return _error(413, f"request body exceeds the limit of {limit} bytes")
    try:
        if verb == "predict":
            return await _answer(request, lv, body)
        return await _answer_examples(request, lv, body, verb)
    finally:
        request.app[RELEASER_KEY].after_request(len(body))


async def _off_loop(request: web.Request, large: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: inline when small; when large, on a worker thread, one at a time.

    A large body's JSON is millions of Python objects while it is decoded (a large answer's
    text, while it is encoded). One at a time, 12 concurrent 40,000-row requests peak at a
    few hundred MB instead of 3 GB, and leave the heap near its baseline, with the event
    loop free for other requests meanwhile.
    """
    if not large:
        return fn(*args)
    async with request.app[LARGE_KEY]:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _size(outputs: dict[str, Any]) -> int:
    return sum(int(getattr(v, "size", 1)) for v in outputs.values())


async def _answer(request: web.Request, lv: LoadedVersion, body: bytes) -> web.Response:
    max_rows = request.app[MAX_ROWS_KEY]

    def specs(signature: str) -> FeatureSpec:
        try:
            return lv.signature(signature).input_spec
        except SignatureNotFound:  # REST's words (GetInfoMap), not gRPC's
            raise InvalidRequest(signature_not_found(signature)) from None

    large = len(body) > _LARGE_BODY_BYTES
    decoded = await _off_loop(request, large, decode_request, body, specs, max_rows)
    outputs = await _run(lv, decoded.signature, decoded.inputs)
    if isinstance(outputs, web.Response):
        return outputs
    large = _size(outputs) > _LARGE_ANSWER_VALUES
    data = await _off_loop(request, large, encode_predict_response, outputs, decoded.columnar)
    return web.Response(body=data, content_type="application/json")


async def _run(
    lv: LoadedVersion, signature: str, inputs: dict[str, Any]
) -> dict[str, Any] | web.Response:
    """Run a signature; an error TensorFlow raises is TF Serving's 400 or 500 answer."""
    try:
        return await lv.predict(inputs, signature)
    except Exception as e:  # TensorFlow rejected inputs the schema let through
        log.warning("model %s version %d: prediction failed: %s", lv.model, lv.version, e)
        return _error(400 if type(e).__name__ == "InvalidArgumentError" else 500, model_error(e))


async def _answer_examples(
    request: web.Request, lv: LoadedVersion, body: bytes, verb: str
) -> web.Response:
    """``:classify`` / ``:regress``: examples in, ``{"results": ...}`` out."""
    large = len(body) > _LARGE_BODY_BYTES
    decoded = await _off_loop(
        request, large, decode_example_request, body, verb, request.app[MAX_ROWS_KEY]
    )
    try:
        sig = lv.signature(decoded.signature)
    except SignatureNotFound:  # classifier.cc / regressor.cc's message, not predict's
        raise InvalidRequest(missing_signature(decoded.signature)) from None
    wanted = CLASSIFY_METHOD if verb == "classify" else REGRESS_METHOD
    name = example_input_name(sig.name, sig.input_spec, sig.output_spec, wanted)
    outputs = await _run(lv, sig.name, {name: example_batch(decoded.examples)})
    if isinstance(outputs, web.Response):
        return outputs
    encode = encode_classification if verb == "classify" else encode_regression
    large = _size(outputs) > _LARGE_ANSWER_VALUES
    data = await _off_loop(request, large, encode, outputs, decoded.rows)
    return web.Response(body=data, content_type="application/json")


async def _read_body(request: web.Request, limit: int) -> bytes | None:
    """The request body, or None once it exceeds ``limit`` bytes.

    The received chunks are joined once; ``Request.read`` copies the whole body twice more.
    """
    request.content.set_read_chunk_size(limit)
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def create_app(
    repository: ModelRepository,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_rows: int = DEFAULT_MAX_ROWS,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
) -> web.Application:
    """The aiohttp application serving a model repository.

    Args:
        repository: The models to serve.
        max_body_bytes: Larger request bodies get 413.
        max_rows: Larger batches get 400.
        body_timeout: Seconds a request body may take to arrive; then 408 and the
            connection is closed.

    Returns:
        The application (routes every path; unknown ones get TF Serving's 404 shape).
    """
    app = web.Application(client_max_size=max_body_bytes)
    app[REPO_KEY] = repository
    app[MAX_ROWS_KEY] = max_rows
    app[MAX_BODY_KEY] = max_body_bytes
    app[BODY_TIMEOUT_KEY] = body_timeout
    app[RELEASER_KEY] = MemoryReleaser()
    app[LARGE_KEY] = asyncio.Semaphore(1)
    app.router.add_route("*", "/{tail:.*}", _handle)
    return app


class ServingServer:
    """A running server: the HTTP listener plus the base-path watcher.

    The listeners (REST, and gRPC with ``grpc_port``) close connections whose request
    head takes longer than ``header_timeout`` seconds, close when a response is not taken
    within ``send_timeout`` and idle connections after ``keepalive_timeout``; REST answers
    408 and closes when a body takes longer than ``body_timeout``. Both keep their
    connections together within ``max_connections`` (default: below the open file limit),
    closing the longest idle one for each connection beyond
    (:mod:`trainyard.serving.http_guard`).
    """

    def __init__(
        self,
        base_path: Path,
        host: str = "127.0.0.1",
        port: int = 8501,
        poll_interval: float = 1.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        model_threads: int = 2,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        config_file: Path | None = None,
        grpc_port: int | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT,
        max_connections: int | None = None,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
    ) -> None:
        self.grpc_port = grpc_port
        self._grpc: Any = None
        self.repository = ModelRepository(
            base_path,
            config_file=config_file,
            poll_interval=poll_interval,
            predict_threads=model_threads,
            intra_op_threads=intra_op_threads,
            inter_op_threads=inter_op_threads,
        )
        self.host = host
        self.port = port
        self._app = create_app(
            self.repository,
            max_body_bytes=max_body_bytes,
            max_rows=max_rows,
            body_timeout=body_timeout,
        )
        self.guard = ConnectionGuard(
            max_connections if max_connections is not None else default_max_connections(),
            header_timeout,
            send_timeout,
        )
        self.keepalive_timeout = keepalive_timeout
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._stop = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen, then start watching the base path.

        Returns:
            The bound port (useful with ``port=0``).
        """
        self._runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=10.0)
        await self._runner.setup()
        protocol = functools.partial(
            GuardedRequestHandler,
            self._runner.server,
            self.guard,
            loop=asyncio.get_running_loop(),
            access_log=None,
            keepalive_timeout=self.keepalive_timeout,
        )
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                protocol, self.host, self.port, backlog=128, reuse_address=True
            )
        except OSError as e:
            await self._runner.cleanup()
            why = os.strerror(e.errno).lower() if e.errno else str(e)
            raise OSError(e.errno, f"cannot listen on {self.host}:{self.port}: {why}") from e
        self.port = int(self._listener.sockets[0].getsockname()[1])
        log.info("serving %s on http://%s:%d", self.repository.base_path, self.host, self.port)
        if self.grpc_port is not None:
            from trainyard.serving.grpc_api import start_grpc_server

            try:
                self._grpc = await start_grpc_server(
                    self.repository,
                    self.host,
                    self.grpc_port,
                    self._app[MAX_ROWS_KEY],
                    self.guard,
                    self.keepalive_timeout,
                )
                self.grpc_port = self._grpc.port
            except OSError:  # no half-started server: the HTTP side goes too
                self._listener.close()
                await self._runner.cleanup()
                raise
            log.info("gRPC (TF Serving's API) on %s:%d", self.host, self.grpc_port)
        self._watcher = asyncio.create_task(self.repository.watch(self._stop))
        return self.port

    async def stop(self) -> None:
        """Stop watching, finish in-flight requests, release models."""
        self._stop.set()
        if self._grpc is not None:
            await self._grpc.stop(grace=5)
        if self._watcher is not None:
            await self._watcher
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.get_running_loop().run_in_executor(None, self.repository.close)


async def serve_until_signalled(server: ServingServer) -> None:
    """Run ``server`` until SIGTERM or SIGINT, then shut it down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    log.info("shutting down (finishing in-flight requests)")
    await server.stop()
    log.info("stopped")


def cli_main(argv: list[str]) -> int:
    """``trainyard serve --base-path DIR --port P [--host H] [--poll-interval S]``.

    Args:
        argv: Command-line arguments after ``serve``.

    Returns:
        0 after a graceful shutdown.
    """
    from trainyard.settings import get_settings

    parser = argtypes.ArgumentParser(prog="trainyard serve", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-path",
        type=Path,
        default=None,
        help="model base path (default: <volume_root>/_serving)",
    )
    parser.add_argument(
        "--model-config-file",
        type=Path,
        default=None,
        help="TF Serving model config (text protobuf): serve exactly the models, versions and "
        "labels it lists, re-read every poll (default: every model folder of the base path, "
        "highest version)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=argtypes.port_or_zero, default=8501)
    parser.add_argument(
        "--grpc-port",
        type=argtypes.port_or_zero,
        default=None,
        help="also serve TF Serving's gRPC API (PredictionService, ModelService) on this "
        "port (TF Serving's default is 8500; default: off)",
    )
    parser.add_argument(
        "--poll-interval",
        type=argtypes.positive_float,
        default=1.0,
        help=f"seconds between scans of the base path (at least {MIN_POLL_INTERVAL:g})",
    )
    parser.add_argument(
        "--max-body-mb", type=argtypes.positive_float, default=DEFAULT_MAX_BODY_BYTES / 2**20
    )
    parser.add_argument(
        "--max-rows",
        type=argtypes.positive_int,
        default=DEFAULT_MAX_ROWS,
        help="most rows one predict request may hold (more: 400)",
    )
    parser.add_argument(
        "--header-timeout",
        type=argtypes.positive_float,
        default=DEFAULT_HEADER_TIMEOUT,
        help="seconds a connection may take to send a complete request head (line and "
        "headers; gRPC: the HTTP/2 preface and first frame) before it is closed",
    )
    parser.add_argument(
        "--body-timeout",
        type=argtypes.positive_float,
        default=DEFAULT_BODY_TIMEOUT,
        help="seconds a request body may take to arrive (then 408 and the connection closes)",
    )
    parser.add_argument(
        "--send-timeout",
        type=argtypes.positive_float,
        default=DEFAULT_SEND_TIMEOUT,
        help="seconds a client may take to receive a response before its connection closes",
    )
    parser.add_argument(
        "--keepalive-timeout",
        type=argtypes.positive_float,
        default=DEFAULT_KEEPALIVE_TIMEOUT,
        help="seconds an idle keep-alive (REST) or call-less (gRPC) connection stays open",
    )
    parser.add_argument(
        "--max-connections",
        type=argtypes.positive_int,
        default=None,
        help="open connections allowed, REST and gRPC together (a gRPC one counts 3: it holds "
        "3 file descriptors); each one beyond closes the longest idle (default: the open "
        "file limit less a quarter, at least 256 less)",
    )
    parser.add_argument(
        "--model-threads",
        type=argtypes.positive_int,
        default=None,
        help="model calls (one per request) that may run at once (default: one per core)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=argtypes.non_negative_int,
        default=1,
        help="threads one TensorFlow op may use (default: 1, concurrent model calls spread "
        "over the cores; 0: TensorFlow's default, one per core)",
    )
    parser.add_argument(
        "--inter-op-threads",
        type=argtypes.non_negative_int,
        default=None,
        help="threads that run TensorFlow ops, for all model calls together (default: one "
        "per core; 0: TensorFlow's default)",
    )
    args = parser.parse_args(argv)
    if args.poll_interval < MIN_POLL_INTERVAL:
        parser.error(f"argument --poll-interval: at least {MIN_POLL_INTERVAL:g} s")
    if args.grpc_port is not None and args.grpc_port == args.port and args.port != 0:
        parser.error(f"argument --grpc-port: {args.grpc_port} is also --port")
    args.model_threads, args.inter_op_threads = pool_sizes(
        args.model_threads, args.inter_op_threads, usable_cores()
    )
    base = args.base_path or get_settings().serving_root
    base.mkdir(parents=True, exist_ok=True)
    tune_allocator()
    server = ServingServer(
        base,
        host=args.host,
        port=args.port,
        poll_interval=args.poll_interval,
        max_body_bytes=int(args.max_body_mb * 2**20),
        model_threads=args.model_threads,
        intra_op_threads=args.intra_op_threads,
        inter_op_threads=args.inter_op_threads,
        config_file=args.model_config_file,
        grpc_port=args.grpc_port,
        max_rows=args.max_rows,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keepalive_timeout=args.keepalive_timeout,
        max_connections=args.max_connections,
        send_timeout=args.send_timeout,
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        try:
            runner.run(serve_until_signalled(server))
        except OSError as e:  # a port taken, an address not of this machine
            raise ServingError(e.strerror or str(e)) from e
    return 0


def pool_sizes(
    model_threads: int | None, inter_op_threads: int | None, cores: int
) -> tuple[int, int]:
    """Model calls that may run at once and TensorFlow op threads, for ``trainyard serve``.

    Returns:
        ``(model_threads, inter_op_threads)``: the values given, else one of each per core.
    """
    return (
        cores if model_threads is None else model_threads,
        cores if inter_op_threads is None else inter_op_threads,
    )


def _loop_factory() -> Any:
    """The event loop factory: uvloop's when it is installed, else asyncio's default (None).

    uvloop's socket reads/writes and thread hand-offs are C; with asyncio's they were
    about a quarter of the server's CPU per batched request.
    """
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
