"""The API server's objects: kinds, storage, selectors, patches and the change log."""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One kind the server serves (its REST path and whether it lives in a namespace)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KUEUE = "kueue.x-k8s.io"
RESOURCES = [
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    Resource("", "v1", "events", "Event"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("batch", "v1", "jobs", "Job"),
    Resource("apps", "v1", "deployments", "Deployment"),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
    Resource("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False),
    Resource("snapshot.storage.k8s.io", "v1", "volumesnapshots", "VolumeSnapshot"),
    Resource(
        "snapshot.storage.k8s.io",
        "v1",
        "volumesnapshotclasses",
        "VolumeSnapshotClass",
        namespaced=False,
    ),
    Resource(KUEUE, "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False),
    Resource(KUEUE, "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False),
    Resource(KUEUE, "v1beta2", "localqueues", "LocalQueue"),
    Resource(KUEUE, "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", False),
]
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}


class ApiError(Exception):
    """An API error, answered as a ``Status`` object."""

    REASONS = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        405: "MethodNotAllowed",
        409: "AlreadyExists",
        410: "Gone",
        415: "UnsupportedMediaType",
        422: "Invalid",
    }

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or self.REASONS.get(code, "InternalError")

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def truthy(value: str | None) -> bool:
    """A boolean query parameter (clients send ``true``, ``True`` or ``1``)."""
    return (value or "").lower() in ("true", "1")


def now() -> str:
    """RFC 3339 time, as the API server writes it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


# ------------------------------------------------------------------------------ selectors

_REQ = re.compile(
    r"\s*(?P<not>!)?(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|!=|=|\s+in\s+|\s+notin\s+)\s*(?P<val>\([^)]*\)|[A-Za-z0-9._-]*))?\s*"
)


def _split_requirements(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur] if cur.strip() else out


def selector_matcher(text: str | None) -> Callable[[dict[str, str]], bool]:
    """A label selector (``a=b,c!=d,!e,f,g in (x,y)``) as a predicate on labels."""
    if not text:
        return lambda _labels: True
    tests: list[Callable[[dict[str, str]], bool]] = []
    for req in _split_requirements(text):
        m = _REQ.fullmatch(req)
        if not m:
            raise ApiError(400, f"unable to parse requirement: {req!r}")
        key, op, val = m["key"], (m["op"] or "").strip(), m["val"]
        if m["not"]:
            tests.append(lambda lb, k=key: k not in lb)
        elif not op:
            tests.append(lambda lb, k=key: k in lb)
        elif op in ("=", "=="):
            tests.append(lambda lb, k=key, v=val: lb.get(k) == v)
        elif op == "!=":
            tests.append(lambda lb, k=key, v=val: lb.get(k) != v)
        else:
            values = {v.strip() for v in val.strip("()").split(",")}
            if op == "in":
                tests.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                tests.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
    return lambda labels: all(t(labels) for t in tests)


def match_labels(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    """Whether ``labels`` hold every pair of a ``matchLabels``/Service selector."""
    labels = labels or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def field_matcher(text: str | None) -> Callable[[Obj], bool]:
    """A field selector (``metadata.name=x,involvedObject.name=y,status.phase!=z``)."""
    if not text:
        return lambda _obj: True
    tests = []
    for req in text.split(","):
        neg = "!=" in req
        path, _, value = req.partition("!=" if neg else "=")
        path = path.strip().removesuffix("=")
        keys = path.split(".")

        def test(obj: Obj, keys: list[str] = keys, value: str = value, neg: bool = neg) -> bool:
            cur: Any = obj
            for k in keys:
                cur = cur.get(k) if isinstance(cur, dict) else None
            return (str(cur if cur is not None else "") == value) != neg

        tests.append(test)
    return lambda obj: all(t(obj) for t in tests)


# -------------------------------------------------------------------------------- patches

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
}
"""List fields a strategic merge patch merges by key (the rest are replaced)."""


def merge_patch(target: Any, patch: Any, strategic: bool = False, field: str = "") -> Any:
    """RFC 7386 merge patch; with ``strategic``, lists of :data:`MERGE_KEYS` merge by key."""
    if isinstance(patch, list) and strategic and isinstance(target, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        if field == "ports" and patch and "containerPort" not in patch[0]:
            key = "port"  # a Service's ports
        out = [copy.deepcopy(t) for t in target]
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                return copy.deepcopy(patch)
            if item.get("$patch") == "delete":
                out = [t for t in out if t.get(key) != item[key]]
                continue
            for i, t in enumerate(out):
                if isinstance(t, dict) and t.get(key) == item[key]:
                    out[i] = merge_patch(t, item, strategic)
                    break
            else:
                out.append(copy.deepcopy(item))
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v, strategic, k)
    return result


def json_patch(target: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 JSON patch (add, replace, remove; paths with ``~1`` and ``~0``)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if op["op"] == "add":
                    parent.insert(idx, op["value"])
                else:
                    parent[idx] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                parent.pop(last, None)
        else:
            raise ApiError(422, f"unsupported JSON patch op {op['op']!r}")
    return doc


# ---------------------------------------------------------------------------------- store


@dataclass
class Change:
    """One entry of the change log (what watches stream)."""

    rv: int
    type: str
    plural: str
    obj: Obj


class Store:
    """Every object, keyed by (plural, namespace, name), with resource versions.

    Writers hold :attr:`lock`; :attr:`changed` is notified after each write (watches and
    the controllers wait on it).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 0
        self.log: list[Change] = []

    def _bump(self, change: str, plural: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append(Change(self.rv, change, plural, copy.deepcopy(obj)))
        self.changed.notify_all()

    def get(self, plural: str, ns: str, name: str) -> Obj:
        with self.lock:
            obj = self.objects.get((plural, ns, name))
            if obj is None:
                raise ApiError(404, f'{plural} "{name}" not found')
            return copy.deepcopy(obj)

    def find(self, plural: str, ns: str, name: str) -> Obj | None:
        with self.lock:
            obj = self.objects.get((plural, ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self,
        plural: str,
        ns: str | None = None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> list[Obj]:
        by_label, by_field = selector_matcher(labels), field_matcher(fields)
        with self.lock:
            return [
                copy.deepcopy(o)
                for (p, n, _), o in sorted(self.objects.items())
                if p == plural
                and (ns is None or n == ns)
                and by_label(o["metadata"].get("labels") or {})
                and by_field(o)
            ]

    def create(
        self, res: Resource, ns: str, body: Obj, prepare: Callable[[Obj], Any] | None = None
    ) -> Obj:
        """Store a new object (uid, creation time, generation 1); ``prepare`` sees it first."""
        meta = body.setdefault("metadata", {})
        with self.lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            name = meta.get("name")
            if not name:
                raise ApiError(422, f"{res.kind}: metadata.name: Required value")
            key = (res.plural, ns, name)
            if key in self.objects:
                raise ApiError(409, f'{res.plural} "{name}" already exists')
            body["apiVersion"], body["kind"] = res.api_version, res.kind
            if res.namespaced:
                meta["namespace"] = ns
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
            if prepare is not None:
                prepare(body)
            self.objects[key] = body
            self._bump("ADDED", res.plural, body)
            return copy.deepcopy(body)

    def update(self, plural: str, ns: str, name: str, mutate: Callable[[Obj], Any]) -> Obj:
        """Change an object in place; a changed ``spec`` bumps ``metadata.generation``."""
        with self.lock:
            obj = self.objects.get((plural, ns, name))
            if obj is None:
                raise ApiError(404, f'{plural} "{name}" not found')
            before = json.dumps(obj, sort_keys=True)
            spec_before = json.dumps(obj.get("spec"), sort_keys=True)
            mutate(obj)
            if json.dumps(obj, sort_keys=True) == before:
                return copy.deepcopy(obj)
            if json.dumps(obj.get("spec"), sort_keys=True) != spec_before:
                obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            self._bump("MODIFIED", plural, obj)
            return copy.deepcopy(obj)

    def remove(self, plural: str, ns: str, name: str) -> Obj | None:
        with self.lock:
            obj = self.objects.pop((plural, ns, name), None)
            if obj is not None:
                self._bump("DELETED", plural, obj)
            return obj

    def changes_after(self, rv: int) -> Iterator[Change]:
        with self.lock:
            return iter([c for c in self.log if c.rv > rv])
