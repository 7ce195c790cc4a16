"""The HTTP side: REST verbs, watches, logs and exec, authorized by RBAC, validated on create.

Paths are the API server's: ``/api/v1/namespaces/<ns>/<plural>[/<name>[/<sub>]]`` and
``/apis/<group>/<version>/...``. Each request is authenticated by its bearer token (a user
of :attr:`ApiServer.tokens`), authorized against the RBAC Roles bound to it in the
namespace (cluster admins pass), recorded in :attr:`ApiServer.requests` and answered in
JSON; errors are ``Status`` objects with the API server's codes and reasons.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.localkube.store import BY_KIND, BY_PATH, ApiError, Obj, Resource, Store, now, truthy

if TYPE_CHECKING:
    from tests.localkube.cluster import LocalCluster

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
DEFAULT_GC = {"jobs": "Orphan"}
"""Deletion propagation when a request names none (batch/v1 Jobs orphan their pods)."""


@dataclass
class Request:
    """One API request, as recorded for tests (``name``: for a create, the one created)."""

    at: float
    user: str
    verb: str
    plural: str
    namespace: str
    name: str
    sub: str
    query: dict[str, str]
    code: int = 0
    done: float = 0.0


@dataclass(frozen=True)
class Target:
    """What a path names."""

    res: Resource
    ns: str
    name: str
    sub: str


def parse_path(path: str) -> Target:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    ns = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    plural, name, sub = [*rest, "", "", ""][:3]
    res = BY_PATH.get((group, version, plural))
    if res is None:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    return Target(res, ns, name, sub)


# ------------------------------------------------------------------------------ websocket


class WebSocket:
    """The server end of a WebSocket (RFC 6455): binary frames out, masked frames in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, data: bytes, opcode: int = 0x2) -> None:
        head = bytes([0x80 | opcode])
        n = len(data)
        if n < 126:
            head += bytes([n])
        elif n < 1 << 16:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        with self.lock:
            self.sock.sendall(head + data)

    def channel(self, channel: int, data: bytes) -> None:
        self.send(bytes([channel]) + data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(struct.pack(">H", 1000), opcode=0x8)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("websocket closed")
            buf += chunk
        return buf

    def recv(self) -> tuple[int, bytes]:
        """The next message: (opcode, payload); opcode 8 is close."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", self._read(2))
        elif n == 127:
            (n,) = struct.unpack(">Q", self._read(8))
        mask = self._read(4) if b1 & 0x80 else b"\0\0\0\0"
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(self._read(n)))
        return b0 & 0x0F, data


# -------------------------------------------------------------------------------- handler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"the request body is not JSON: {e}") from None

    def send_json(self, code: int, obj: Any, warnings: list[str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for w in warnings or []:
            self.send_header("Warning", f'299 - "{w}"')
        self.end_headers()
        self.wfile.write(data)

    def start_chunks(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _dispatch(self, method: str) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        request: Request | None = None
        try:
            if url.path == "/version":
                self.send_json(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
                return
            user = api.authenticate(self.headers.get("Authorization"))
            target = parse_path(url.path)
            verb = api.verb(method, target, query, self.headers)
            request = api.record(user, verb, target, query)
            api.authorize(user, verb, target)
            api.handle(self, method, verb, target, query, request)
            request.code = 200
        except ApiError as e:
            if request is not None:
                request.code = e.code
            with contextlib.suppress(OSError):
                self.send_json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if request is not None:
                request.done = time.monotonic()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a killed task) is no error of the server."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


# ---------------------------------------------------------------------------- api server


class ApiServer:
    """Verbs on the store, for one :class:`~tests.localkube.cluster.LocalCluster`.

    Args:
        cluster: The cluster (store, kubelet, admission).
        tokens: Bearer token → user name; ``system:admin`` passes every check, a service
            account (``system:serviceaccount:<ns>:<name>``) is held to its Roles.
    """

    def __init__(self, cluster: LocalCluster, tokens: dict[str, str]) -> None:
        self.cluster = cluster
        self.store: Store = cluster.store
        self.tokens = tokens
        self.requests: list[Request] = []
        self.stopping = threading.Event()
        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.api = self
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ authn, authz

    def authenticate(self, header: str | None) -> str:
        token = (header or "").removeprefix("Bearer ").strip()
        user = self.tokens.get(token)
        if user is None:
            raise ApiError(401, "Unauthorized")
        return user

    @staticmethod
    def verb(method: str, t: Target, query: dict[str, str], headers: Any) -> str:
        if t.sub == "exec":
            return "create"  # a WebSocket GET needs create too (Kubernetes >= 1.31)
        if method == "GET":
            if t.name:
                return "get"
            return "watch" if truthy(query.get("watch")) else "list"
        return {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if t.name else "deletecollection",
        }[method]

    def record(self, user: str, verb: str, t: Target, query: dict[str, str]) -> Request:
        request = Request(time.monotonic(), user, verb, t.res.plural, t.ns, t.name, t.sub, query)
        self.requests.append(request)
        return request

    def authorize(self, user: str, verb: str, t: Target) -> None:
        if user == "system:admin":
            return
        resource = f"{t.res.plural}/{t.sub}" if t.sub else t.res.plural
        prefix = "system:serviceaccount:"
        if user.startswith(prefix) and t.ns:
            sa_ns, sa = user[len(prefix) :].split(":", 1)
            for rb in self.store.list("rolebindings", t.ns):
                subjects = rb.get("subjects") or []
                if not any(
                    s.get("kind") == "ServiceAccount"
                    and s.get("name") == sa
                    and s.get("namespace", t.ns) == sa_ns
                    for s in subjects
                ):
                    continue
                ref = rb.get("roleRef") or {}
                role = self.store.find("roles", t.ns, ref.get("name", ""))
                for rule in (role or {}).get("rules") or []:
                    if (
                        (t.res.group in rule.get("apiGroups", []) or "*" in rule["apiGroups"])
                        and (resource in rule.get("resources", []) or "*" in rule["resources"])
                        and (verb in rule.get("verbs", []) or "*" in rule["verbs"])
                        and (not rule.get("resourceNames") or t.name in rule["resourceNames"])
                    ):
                        return
        group = f'in API group "{t.res.group}"' if t.res.group else 'in API group ""'
        where = f' in the namespace "{t.ns}"' if t.ns else " at the cluster scope"
        raise ApiError(
            403,
            f'{t.res.plural}{"/" + t.sub if t.sub else ""} is forbidden: User "{user}" cannot '
            f'{verb} resource "{resource}" {group}{where}',
        )

    # ------------------------------------------------------------------------ verbs

    def handle(
        self,
        h: Handler,
        method: str,
        verb: str,
        t: Target,
        query: dict[str, str],
        request: Request,
    ) -> None:
        res = t.res
        if t.sub == "log":
            self.cluster.kubelet.serve_log(h, t.ns, t.name, query)
            return
        if t.sub == "exec":
            self.cluster.kubelet.serve_exec(h, t.ns, t.name, query, h.path)
            return
        if verb in ("list", "watch"):
            ns = t.ns or None
            if verb == "watch":
                self.watch(h, res, ns, query)
                return
            items = self.store.list(
                res.plural, ns, query.get("labelSelector"), query.get("fieldSelector")
            )
            h.send_json(
                200,
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": items,
                },
            )
            return
        if verb == "get":
            h.send_json(200, self.store.get(res.plural, t.ns, t.name))
            return
        body = h._body()
        dry = "dryRun" in query
        if verb == "create":
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be an object")
            ns = t.ns if res.namespaced else ""
            obj, warnings = self.cluster.create(res, ns, body, dry_run=dry)
            request.name = obj["metadata"]["name"]
            h.send_json(200 if dry else 201, obj, warnings)
        elif verb in ("update", "patch"):
            ctype = (h.headers.get("Content-Type") or "").split(";")[0]
            h.send_json(200, self.cluster.modify(res, t.ns, t.name, t.sub, verb, body, ctype, dry))
        elif verb == "delete":
            opts = dict(body or {})
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    opts[key] = query[key]
            h.send_json(200, self.cluster.delete(res, t.ns, t.name, opts, dry))
        elif verb == "deletecollection":
            opts = dict(body or {})
            items = self.store.list(
                res.plural, t.ns or None, query.get("labelSelector"), query.get("fieldSelector")
            )
            for item in items:
                meta = item["metadata"]
                try:
                    self.cluster.delete(res, meta.get("namespace", ""), meta["name"], opts, dry)
                except ApiError as e:
                    if e.code != 404:
                        raise
            h.send_json(
                200,
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.api_version,
                    "metadata": {},
                    "items": items,
                },
            )
        else:
            raise ApiError(405, f"{method} is not supported on {res.plural}")

    def watch(self, h: Handler, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        from tests.localkube.store import field_matcher, selector_matcher

        by_label = selector_matcher(query.get("labelSelector"))
        by_field = field_matcher(query.get("fieldSelector"))
        timeout = float(query.get("timeoutSeconds") or 1800)
        end = time.monotonic() + timeout
        h.start_chunks("application/json")

        def matches(obj: Obj) -> bool:
            meta = obj["metadata"]
            return (
                (ns is None or meta.get("namespace", "") == ns)
                and by_label(meta.get("labels") or {})
                and by_field(obj)
            )

        def send(kind: str, obj: Obj) -> None:
            h.chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        rv_text = query.get("resourceVersion")
        with self.store.lock:
            if rv_text in (None, "", "0"):
                last = self.store.rv
                initial = self.store.list(res.plural, ns)
            else:
                last, initial = int(rv_text), []
                if self.store.log and self.store.log[0].rv > last + 1:
                    raise ApiError(410, f"too old resource version: {last}")
        try:
            for obj in initial:
                if matches(obj):
                    send("ADDED", obj)
            while time.monotonic() < end and not self.stopping.is_set():
                with self.store.changed:
                    if self.store.rv == last:
                        self.store.changed.wait(timeout=1.0)
                    changes = list(self.store.changes_after(last))
                for c in changes:
                    last = c.rv
                    if c.plural == res.plural and matches(c.obj):
                        send(c.type, c.obj)
            h.end_chunks()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass


def websocket_accept(h: Handler) -> WebSocket:
    """Answer a WebSocket upgrade with the v4 channel protocol."""
    key = h.headers.get("Sec-WebSocket-Key")
    if not key or (h.headers.get("Upgrade") or "").lower() != "websocket":
        raise ApiError(400, "Upgrade request required")
    accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
    h.send_response(101, "Switching Protocols")
    h.send_header("Upgrade", "websocket")
    h.send_header("Connection", "Upgrade")
    h.send_header("Sec-WebSocket-Accept", accept)
    h.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
    h.end_headers()
    h.wfile.flush()
    h.close_connection = True
    return WebSocket(h.connection)


def status_ok() -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def resource_for(obj: Obj) -> Resource:
    res = BY_KIND.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if res is None:
        raise ApiError(404, f"no kind {obj.get('kind')} in {obj.get('apiVersion')}")
    return res


def stamped(obj: Obj) -> Obj:
    """A copy with ``deletionTimestamp`` set (a delete that takes time)."""
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("deletionTimestamp", now())
    return out
