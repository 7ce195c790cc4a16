"""Connection hardening for both listeners: head and send deadlines, one connection cap.

Left to itself, aiohttp keeps a connection that never completes a request head until its
keep-alive timer fires (3630 s by default), gRPC until its handshake times out (120 s), and
both accept connections until the process runs out of file descriptors, after which
``accept()`` fails and good clients of either are turned away. One :class:`ConnectionGuard`
counts the connections of both; :class:`GuardedRequestHandler` (aiohttp's protocol, one
per REST connection) and :class:`GrpcRelay` (one per gRPC connection, relayed to the
in-process gRPC server on a private Unix socket) add:

* a head deadline: the request line and headers must be complete within ``header_timeout``
  seconds of the connection opening (its first request) or of the first byte of a later
  request on a keep-alive connection; otherwise the connection is closed;
* a send deadline: a response must be taken by the client within ``send_timeout`` seconds,
  else the connection is closed (a client that stops reading holds no request forever);
* a connection cap (:class:`ConnectionGuard`): beyond ``max_connections`` (a gRPC
  connection counts three: the client's socket and both ends of the relay's), each new
  one closes the connection that has been idle longest (no request or call in progress:
  a fresh or half-open one, or a keep-alive one idle for ``KEEPALIVE_GRACE_S``, and none
  with an answer still in its send buffer), or itself when no other one may go, so the
  process stays below its file descriptor limit and a flood of idle connections only
  displaces itself. A keep-alive client between two requests is not cut off: its next
  request may already be on the wire;
* :func:`close_after_response`, which the request handler calls after a body deadline so
  the connection closes as soon as the 408 answer is sent, instead of lingering;
* one log line, not aiohttp's traceback, for a client's fault: a malformed request (it gets
  its 400) or a connection lost mid-request, so no client can flood the log.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, Protocol

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

log = logging.getLogger("trainyard.serving")

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_SEND_TIMEOUT = 60.0
DEFAULT_KEEPALIVE_TIMEOUT = 75.0
# Descriptors kept free below RLIMIT_NOFILE: model files, the gRPC listener, logs, and the
# connections one event loop turn accepts (up to the listen backlog) before any is evicted.
_MIN_FD_RESERVE = 256
# A keep-alive connection idle for less than this may be about to send its next request.
KEEPALIVE_GRACE_S = 1.0


def default_max_connections() -> int:
    """The connection cap that keeps the process below its open file limit.

    Returns:
        The soft ``RLIMIT_NOFILE`` less a reserve of a quarter of it (at least 256 file
        descriptors), and at least 16.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        soft = 1 << 20
    return max(16, soft - max(_MIN_FD_RESERVE, soft // 4))


class Guarded(Protocol):
    """What the guard needs of a connection (REST handler or gRPC relay)."""

    weight: int

    @property
    def answered(self) -> int:
        """Requests (or calls) this connection has answered."""
        ...

    @property
    def transport(self) -> asyncio.BaseTransport | None:
        """The client's transport (None once closed)."""
        ...

    def shut(self, reason: str) -> None:
        """Close the connection now."""
        ...


class ConnectionGuard:
    """The open connections of both listeners, idle ones in the order they became idle.

    Args:
        max_connections: Connections allowed (a gRPC one counts ``GrpcRelay.weight``);
            one more evicts the longest idle.
        header_timeout: Seconds a request head may take (see the module docstring).
        send_timeout: Seconds the client may take to receive a response.
    """

    def __init__(
        self,
        max_connections: int,
        header_timeout: float,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if header_timeout <= 0:
            raise ValueError(f"header_timeout must be positive, got {header_timeout}")
        if send_timeout <= 0:
            raise ValueError(f"send_timeout must be positive, got {send_timeout}")
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.send_timeout = send_timeout
        # Open connections → their weight (file descriptors they hold).
        self._open: dict[Guarded, int] = {}
        self._used = 0
        # Idle connections (no request in progress) → when they became idle, oldest first.
        self._idle: dict[Guarded, float] = {}
        self.evicted = 0
        self.timed_out = 0

    @property
    def open_connections(self) -> int:
        """Connections open and not being closed by the guard."""
        return len(self._open)

    def opened(self, handler: Guarded) -> None:
        """Count a new (idle) connection; beyond the cap, close the longest idle ones."""
        self._open[handler] = handler.weight
        self._used += handler.weight
        self._idle[handler] = time.monotonic()
        while self._used > self.max_connections:
            victim = self._victim(handler)
            self.evicted += 1
            if self.evicted == 1 or self.evicted % 1000 == 0:
                log.warning(
                    "%d connections open (the limit is %d): closing the longest idle "
                    "(%d closed so far)",
                    self._used,
                    self.max_connections,
                    self.evicted,
                )
            victim.shut("connection limit reached")
            if victim is handler:
                return

    def _victim(self, newcomer: Guarded) -> Guarded:
        """The longest idle connection that may be closed, else ``newcomer`` itself."""
        recent = time.monotonic() - KEEPALIVE_GRACE_S
        for handler, since in self._idle.items():
            if handler is newcomer:
                continue
            if handler.answered and since > recent:
                continue  # between two requests of a keep-alive client
            transport = handler.transport
            if transport is not None and transport.get_write_buffer_size():
                continue  # its last answer is still being sent
            return handler
        return newcomer

    def closed(self, handler: Guarded) -> None:
        """Forget a connection that is closed or being closed."""
        self._used -= self._open.pop(handler, 0)
        self._idle.pop(handler, None)

    def busy(self, handler: Guarded) -> None:
        """A request head arrived on ``handler``: it may not be evicted until it is answered."""
        self._idle.pop(handler, None)

    def idle(self, handler: Guarded) -> None:
        """``handler`` answered its requests: it is now the most recently idle connection."""
        if handler in self._open:
            self._idle.pop(handler, None)
            self._idle[handler] = time.monotonic()


class GuardedRequestHandler(RequestHandler):
    """aiohttp's HTTP protocol with a request head deadline, under a :class:`ConnectionGuard`.

    Args:
        manager: The aiohttp low-level server (``AppRunner.server``).
        guard: The listener's guard, shared by all its connections.
        **kwargs: Passed to :class:`aiohttp.web_protocol.RequestHandler`.
    """

    __slots__ = ("_busy", "_close_after_response", "_guard", "_handled", "_head_timer")
    weight = 1

    def __init__(self, manager: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._head_timer: asyncio.TimerHandle | None = None
        # A request head arrived and its response is not finished yet.
        self._busy = False
        self._handled = 0
        self._close_after_response = False

    @property
    def answered(self) -> int:
        """Requests this connection has answered."""
        return self._handled

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A client's fault in one line (WARNING); anything else with aiohttp's traceback."""
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError | ConnectionError):
            malformed = isinstance(exc, HttpProcessingError)
            text = str(exc.message if malformed else exc)
            first = next((line.strip() for line in text.splitlines() if line.strip()), "")
            peer = self.peername
            client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            log.warning(
                "%s from %s: %s: %s",
                "malformed request" if malformed else "connection",
                client,
                type(exc).__name__,
                first,
            )
            return
        super().log_exception(*args, **kw)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the head deadline and count the connection (which may evict another)."""
        super().connection_made(transport)
        self._start_head_timer()
        self._guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        """Stop the head deadline and uncount the connection."""
        self._cancel_head_timer()
        self._guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; a first byte starts the head deadline, a complete head ends it."""
        if not self._busy and data and self._head_timer is None:
            self._start_head_timer()
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads and not self._busy:
            self._busy = True
            self._cancel_head_timer()
            self._guard.busy(self)

    async def _handle_request(self, request: BaseRequest, *args: Any) -> tuple[Any, bool]:
        try:
            return await super()._handle_request(request, *args)
        finally:
            self._handled += 1
            if self._handled >= self._request_count:
                self._busy = False
                self._guard.idle(self)

    async def finish_response(
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> tuple[StreamResponse, bool]:
        """Send the response (closing if it is not taken in time), then close if asked to."""
        try:
            async with asyncio.timeout(self._guard.send_timeout):
                result = await super().finish_response(request, resp, start_time)
        except TimeoutError:
            self.shut(f"response not taken within {self._guard.send_timeout:g} s")
            return resp, True  # aiohttp's "connection reset": it stops serving this one
        if self._close_after_response:
            self.force_close()  # the transport sends what it holds, then closes
        return result

    def shut(self, reason: str) -> None:
        """Close the connection now (no response), removing it from the guard."""
        log.debug("closing connection from %s: %s", self.peername, reason)
        self._guard.closed(self)
        self._cancel_head_timer()
        if self.transport is not None:
            self.transport.abort()  # close() would first wait to send what is buffered
        self.force_close()

    def _start_head_timer(self) -> None:
        self._head_timer = self._loop.call_later(self._guard.header_timeout, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._busy:
            self._guard.timed_out += 1
            self.shut(f"no complete request head within {self._guard.header_timeout:g} s")


def close_after_response(request: BaseRequest) -> None:
    """Close ``request``'s connection once its response is sent (no lingering read)."""
    protocol = request.protocol
    if isinstance(protocol, GuardedRequestHandler):
        protocol._close_after_response = True


# HTTP/2 (RFC 9113): the client's connection preface, frame types and the END_STREAM flag.
_PREFACE = 24
_DATA, _HEADERS, _RST_STREAM, _SETTINGS = 0x0, 0x1, 0x3, 0x4
_END_STREAM = 0x1


class _FrameHeads:
    """The frame headers of one direction of an HTTP/2 connection, as its bytes pass.

    Only the 9-byte headers are read (type, flags, stream); payloads are skipped.
    """

    def __init__(self, preface: int = 0) -> None:
        self._skip = preface
        self._head = b""

    def feed(self, data: bytes) -> list[tuple[int, int, int]]:
        """``(type, flags, stream id)`` of each frame whose header ends in ``data``."""
        out = []
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            take = data[i : i + 9 - len(self._head)]
            self._head += take
            i += len(take)
            if len(self._head) < 9:
                break
            head, self._head = self._head, b""
            self._skip = int.from_bytes(head[:3], "big")
            out.append((head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF))
        return out


class _Upstream(asyncio.Protocol):
    """The relay's connection to the in-process gRPC server."""

    def __init__(self, relay: GrpcRelay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_server(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.relay.server_closed()

    def pause_writing(self) -> None:
        if self.relay.transport is not None:
            self.relay.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.relay.transport is not None:
            self.relay.transport.resume_reading()


class GrpcRelay(asyncio.Protocol):
    """One gRPC client connection under the :class:`ConnectionGuard`, relayed byte for byte.

    The client must send the HTTP/2 preface and its first frame within the head deadline;
    the connection is busy (not evictable) while a call is open: from the client's HEADERS
    on a stream until the server ends it (END_STREAM) or either side resets it. A client
    that leaves the server's answer unread for ``send_timeout`` is closed. The upstream
    connection is opened at the client's first byte, so a silent connection holds one file
    descriptor; :attr:`weight` counts the three an active one holds.

    Args:
        guard: The guard both listeners share.
        upstream: Path of the gRPC server's Unix socket.
    """

    weight = 3

    def __init__(self, guard: ConnectionGuard, upstream: str) -> None:
        self._guard = guard
        self._path = upstream
        self.transport: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self._pending: list[bytes] | None = None  # client bytes before the upstream is open
        self._to_server = _FrameHeads(preface=_PREFACE)
        self._to_client = _FrameHeads()
        self._open_calls: set[int] = set()
        self._calls = 0
        self._head_seen = False
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    @property
    def answered(self) -> int:
        """Calls this connection has completed."""
        return self._calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the head deadline and count the connection (which may evict another)."""
        self.transport = transport  # type: ignore[assignment]
        self._timer = self._loop.call_later(self._guard.header_timeout, self._head_late)
        self._guard.opened(self)

    def data_received(self, data: bytes) -> None:
        """Pass client bytes on; note the first frame and each call opened."""
        if self._closing:
            return
        for kind, _, stream in self._to_server.feed(data):
            if not self._head_seen:
                self._head_seen = True
                self._cancel_timer()
            if kind == _HEADERS and stream and stream not in self._open_calls:
                if not self._open_calls:
                    self._guard.busy(self)
                self._open_calls.add(stream)
            elif kind == _RST_STREAM:
                self._call_ended(stream)
        if self._upstream is not None:
            self._upstream.write(data)
        elif self._pending is not None:
            self._pending.append(data)
        else:
            self._pending = [data]
            self._loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            transport, _ = await self._loop.create_unix_connection(
                lambda: _Upstream(self), self._path
            )
        except OSError as e:
            self.shut(f"gRPC server not reachable: {e}")
            return
        if self._closing:
            transport.abort()
            return
        self._upstream = transport  # type: ignore[assignment]
        for chunk in self._pending or ():
            transport.write(chunk)  # type: ignore[attr-defined]
        self._pending = None

    def from_server(self, data: bytes) -> None:
        """Pass server bytes on; a call ends with the server's END_STREAM or a reset."""
        if self.transport is None or self._closing:
            return
        self.transport.write(data)
        for kind, flags, stream in self._to_client.feed(data):
            if kind == _RST_STREAM or (kind in (_DATA, _HEADERS) and flags & _END_STREAM):
                self._call_ended(stream)

    def _call_ended(self, stream: int) -> None:
        if stream in self._open_calls:
            self._open_calls.discard(stream)
            if not self._open_calls:
                self._calls += 1
                self._guard.idle(self)

    def server_closed(self) -> None:
        """The gRPC server closed its side (a GOAWAY for an idle connection): close ours."""
        if self.transport is not None and not self._closing:
            self._closing = True
            self._guard.closed(self)
            self.transport.close()  # what the server sent still reaches the client

    def pause_writing(self) -> None:
        """The client is not reading: stop reading the server, and give it ``send_timeout``."""
        if self._upstream is not None:
            self._upstream.pause_reading()
        self._cancel_timer()
        self._timer = self._loop.call_later(self._guard.send_timeout, self._send_late)

    def resume_writing(self) -> None:
        """The client reads again."""
        self._cancel_timer()
        if self._upstream is not None:
            self._upstream.resume_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        """Uncount the connection and close the upstream."""
        self._closing = True
        self._cancel_timer()
        self._guard.closed(self)
        self.transport = None
        if self._upstream is not None:
            self._upstream.close()

    def shut(self, reason: str) -> None:
        """Close the connection now (both sides), removing it from the guard."""
        log.debug("closing gRPC connection: %s", reason)
        self._closing = True
        self._cancel_timer()
        self._guard.closed(self)
        if self.transport is not None:
            self.transport.abort()
        if self._upstream is not None:
            self._upstream.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if not self._head_seen:
            self._guard.timed_out += 1
            self.shut(f"no HTTP/2 preface within {self._guard.header_timeout:g} s")

    def _send_late(self) -> None:
        self._timer = None
        self.shut(f"answer not taken within {self._guard.send_timeout:g} s")
