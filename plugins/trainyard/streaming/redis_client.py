"""redis-py clients whose every call ends by a deadline, whatever the server does.

A socket timeout bounds each read, not a call: a server that answers one byte at a time
would hold a caller for ever. Here each command (or pipeline) sent starts a deadline of
``deadline_s`` that its whole reply must meet: every read waits at most what is left, and
a reply not whole by then raises ``redis.TimeoutError`` (the connection is dropped, as
redis-py drops any connection a reply was cut on). Writes, connecting and the handshake
are bounded the same (the socket timeouts are ``deadline_s`` too). Nothing is retried
inside a call: a failing server fails the call, once, and the caller decides (the scorer
exits ``failed`` and its supervisor restarts it with back-off; a task retries).

The replies are parsed by hiredis (redis-py's ``_HiredisParser``, which the deadline
extends) and commands are packed by hiredis too (``hiredis.pack_command`` straight: redis-py's
own hiredis packer first copies every argument in Python, which cost the scorer's commit
of 770 arguments more than the packing), for Unix sockets (the project's own server), TCP
and TLS alike.
"""

from __future__ import annotations

import math
import time
from typing import Any

import hiredis
import redis
from redis._parsers import _HiredisParser
from redis.backoff import NoBackoff
from redis.connection import (
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.retry import Retry
from redis.utils import SENTINEL

REDIS_DEADLINE_S = 10.0
"""How long one call to Redis may take (beyond any ``BLOCK`` it asks for). Nothing
trainyard asks of Redis takes more than milliseconds: a call this late is a stuck server."""


class _DeadlineParser(_HiredisParser):
    """hiredis's parser, each read waiting at most until its connection's deadline."""

    def on_connect(self, connection: Any, **kwargs: Any) -> None:
        super().on_connect(connection, **kwargs)
        self._connection = connection

    def on_disconnect(self) -> None:
        super().on_disconnect()
        self._connection = None

    def read_from_socket(self, timeout: Any = SENTINEL, raise_on_timeout: bool = True) -> Any:
        conn = self._connection
        if conn is None:  # disconnected meanwhile: redis-py says so
            return super().read_from_socket(timeout, raise_on_timeout)
        left = conn.deadline - time.monotonic()
        if left <= 0:
            raise redis.TimeoutError(conn.late())
        if timeout is SENTINEL or timeout is None or timeout > left:
            timeout = left
        try:
            return super().read_from_socket(timeout, raise_on_timeout)
        except redis.TimeoutError:
            if conn.deadline <= time.monotonic():
                raise redis.TimeoutError(conn.late()) from None
            raise


class _HiredisPacker:
    """Commands packed by ``hiredis.pack_command`` (arguments: bytes, str, int, float)."""

    def pack(self, *args: Any) -> list[bytes]:
        """One command as RESP, in one piece.

        Raises:
            redis.DataError: For an argument of another type.
        """
        if isinstance(args[0], str) and " " in args[0]:  # redis-py's "XINFO GROUPS", ...
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as e:
            raise redis.DataError(str(e)) from None


class _Deadline:
    """A connection whose every command sent starts a deadline for its replies."""

    deadline: float = math.inf

    def __init__(self, *args: Any, deadline_s: float, **kwargs: Any) -> None:
        kwargs.update(parser_class=_DeadlineParser, command_packer=_HiredisPacker())
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.deadline_s = deadline_s

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self.deadline = time.monotonic() + self.deadline_s
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def late(self) -> str:
        """The error of a call whose reply was not whole by its deadline."""
        return f"no whole answer within {self.deadline_s:g} s"


class _BoundedConnection(_Deadline, Connection):
    """TCP."""


class _BoundedUnixConnection(_Deadline, UnixDomainSocketConnection):
    """A Unix socket (the project's own server)."""


class _BoundedSSLConnection(_Deadline, SSLConnection):
    """TLS (``rediss://``)."""


_BOUNDED = {
    Connection: _BoundedConnection,
    UnixDomainSocketConnection: _BoundedUnixConnection,
    SSLConnection: _BoundedSSLConnection,
}


def redis_client(url: str, deadline_s: float = REDIS_DEADLINE_S) -> redis.Redis:
    """A redis-py client of ``url`` whose every call ends within ``deadline_s``.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` (redis-py's URL forms).
        deadline_s: The most one call (a command or a pipeline, connecting included) may
            take; a blocking command's own wait (``BLOCK``) counts, so callers add it.

    Returns:
        The client (RESP2, replies as bytes; nothing connects until the first call).

    Raises:
        ValueError: If the URL is not one redis-py reads.
    """
    options = parse_url(url)
    base = options.pop("connection_class", Connection)
    pool = ConnectionPool(
        connection_class=_BOUNDED[base],
        deadline_s=deadline_s,
        socket_timeout=deadline_s,
        socket_connect_timeout=deadline_s,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
        **options,
    )
    return redis.Redis(connection_pool=pool)
