"""A local cluster: the API server, its admission and deletion rules, controllers, kubelet.

Usage::

    cluster = LocalCluster(state_dir, volume_root=..., image_env=..., settings=...)
    cluster.start()
    cluster.apply_files([...deploy/k8s/*.yaml])
    kubeconfig = cluster.kubeconfig(state_dir / "kubeconfig")   # the operators' identity
    ...
    cluster.stop()                                              # no process left behind
"""

from __future__ import annotations

import copy
import ipaddress
import json
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.localkube.api import DEFAULT_GC, ApiServer, resource_for, status_ok
from tests.localkube.store import (
    BY_PATH,
    ApiError,
    Obj,
    Resource,
    Store,
    json_patch,
    merge_patch,
    now,
)

ADMIN_TOKEN = "localkube-admin"
OPERATOR_TOKEN = "localkube-trainyard-airflow"
OPERATOR_USER = "system:serviceaccount:trainyard:trainyard-airflow"
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class LocalCluster:
    """A Kubernetes API server on loopback whose pods are local processes.

    Args:
        state_dir: Where the cluster keeps its files (pods' scratch folders and logs, the
            network map, kubeconfigs).
        volume_root: The local folder every PersistentVolumeClaim's mount maps to.
        image_env: The images' environment: what a pod's process starts from before its
            container's own variables (``PATH``, ``TRAINYARD_PROJECT_DIR``, ...).
        settings: Local settings (``trainyard.settings.Settings``): the checkout's folders
            that the images bake in (contracts, pipelines).
    """

    def __init__(
        self, state_dir: Path, *, volume_root: Path, image_env: dict[str, str], settings: Any
    ) -> None:
        from tests.localkube.controllers import Controllers
        from tests.localkube.kubelet import Kubelet

        self.state_dir = state_dir
        self.volume_root = volume_root
        self.image_env = dict(image_env)
        self.settings = settings
        self.store = Store()
        self.errors: list[str] = []
        self.kubelet = Kubelet(self)
        self.controllers = Controllers(self)
        self.api = ApiServer(self, {ADMIN_TOKEN: "system:admin", OPERATOR_TOKEN: OPERATOR_USER})
        self._ips = iter(ipaddress.ip_network("10.96.0.0/16").hosts())
        self._ips_lock = threading.Lock()
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._run, name="localkube-controllers", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api.port}"

    def start(self) -> None:
        """Serve the API and run the controllers."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.api.start()
        self._loop.start()

    def stop(self) -> None:
        """Stop serving; kill every pod's processes (no process outlives the cluster)."""
        self._stop.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._loop.join(timeout=10)
        self.kubelet.stop_all()
        self.api.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.store.changed:
                self.store.changed.wait(timeout=0.2)
            if self._stop.is_set():
                break
            try:
                self.controllers.reconcile()
            except Exception:  # a controller bug must show in the test, not kill the loop
                self.errors.append(traceback.format_exc())
                time.sleep(0.5)

    def dump_threads(self, path: Path) -> None:
        """Every thread's stack of this process (the server's), for a post-mortem."""
        import sys

        with path.open("w") as f:
            for tid, frame in sys._current_frames().items():
                f.write(f"--- thread {tid}\n{''.join(traceback.format_stack(frame))}\n")

    def kubeconfig(self, path: Path, token: str = OPERATOR_TOKEN, namespace: str = "") -> Path:
        """Write a kubeconfig for this server (default: the operators' service account)."""
        context: dict[str, str] = {"cluster": "localkube", "user": "user"}
        if namespace:
            context["namespace"] = namespace
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "localkube", "cluster": {"server": self.url}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "localkube", "context": context}],
            "current-context": "localkube",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server, as cluster admin."""
        from kubernetes import client

        conf = client.Configuration()
        conf.host = self.url
        conf.api_key = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        return client.ApiClient(conf)

    def apply_files(self, paths: list[Path]) -> list[str]:
        """Create every object of these manifests (``kubectl create -f``), as admin."""
        created = []
        docs = [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]
        docs.sort(key=lambda d: d["kind"] != "Namespace")  # as kubectl: namespaces first
        for doc in docs:
            if True:
                res = resource_for(doc)
                ns = (doc["metadata"].get("namespace") or "") if res.namespaced else ""
                self.create(res, ns, copy.deepcopy(doc))
                created.append(f"{doc['kind']}/{doc['metadata']['name']}")
        return created

    # ------------------------------------------------------------------------ reads

    def objects(self, plural: str, ns: str | None = None, labels: str | None = None) -> list[Obj]:
        """Objects of one kind (tests' view)."""
        return self.store.list(plural, ns, labels)

    def wait_for(self, what: str, test: Callable[[], Any], timeout_s: float) -> Any:
        """Wait until ``test()`` is truthy; its value, or TimeoutError naming ``what``."""
        end = time.monotonic() + timeout_s
        while True:
            value = test()
            if value:
                return value
            if time.monotonic() > end:
                raise TimeoutError(f"localkube: {what} not within {timeout_s:g}s")
            time.sleep(0.2)

    # -------------------------------------------------------------------- writes

    def next_cluster_ip(self) -> str:
        with self._ips_lock:
            return str(next(self._ips))

    def create(
        self, res: Resource, ns: str, body: Obj, *, dry_run: bool = False
    ) -> tuple[Obj, list[str]]:
        """Create an object: defaults, validation, admission, then the store.

        Args:
            res: Its kind.
            ns: Its namespace ("" for cluster-scoped kinds).
            body: The object.
            dry_run: Validate and admit only.

        Returns:
            (the object as stored, warnings).

        Raises:
            ApiError: 404 (no such namespace), 422 (invalid), 403 (refused by admission).
        """
        if res.namespaced and self.store.find("namespaces", "", ns) is None:
            raise ApiError(404, f'namespaces "{ns}" not found')
        body.setdefault("apiVersion", res.api_version)
        body.setdefault("kind", res.kind)
        if res.namespaced:
            body.setdefault("metadata", {})["namespace"] = ns
        warnings = self.validate(res, ns, body)
        self.admit(res, ns, body)
        self.defaults(res, body)
        if dry_run:
            return body, warnings
        prepare = _job_labels if res.plural == "jobs" else None
        obj = self.store.create(res, ns, body, prepare)
        if res.plural == "pods":  # at once: no client waits a poll interval for a local pod
            self.kubelet.sync_pod(obj)
            obj = self.store.get("pods", ns, obj["metadata"]["name"])
        if res.plural == "namespaces":
            self.create(BY_PATH[("", "v1", "serviceaccounts")], obj["metadata"]["name"],
                        {"metadata": {"name": "default"}})  # fmt: skip
        return obj, warnings

    def validate(self, res: Resource, ns: str, body: Obj) -> list[str]:
        """The offline checks, as the API server and Pod Security admission apply them."""
        from trainyard.k8s import checks

        kind, name = body.get("kind"), (body.get("metadata") or {}).get("name", "?")
        errors = [e for e in checks.validate_object(body) if "no schema for" not in e]
        pss: list[str] = []
        path = checks.POD_TEMPLATE_PATHS.get(str(kind))
        if path is not None:
            spec: Any = body
            for key in path:
                spec = spec.get(key) if isinstance(spec, dict) else None
            if isinstance(spec, dict):
                pss = checks.pss_violations(spec, f"{kind}/{name} {'.'.join(path)}")
        invalid = [e for e in errors if e not in pss]
        if invalid:
            raise ApiError(422, f'{kind} "{name}" is invalid: ' + "; ".join(invalid))
        namespace = self.store.find("namespaces", "", ns) if ns else None
        enforced = ((namespace or {}).get("metadata", {}).get("labels") or {}).get(
            POD_SECURITY_ENFORCE
        ) == "restricted"
        if pss and enforced:
            message = f'violates PodSecurity "restricted:latest": {"; ".join(pss)}'
            if kind == "Pod":
                raise ApiError(403, f'pods "{name}" is forbidden: {message}')
            return [f"would {message}"]
        return []

    def admit(self, res: Resource, ns: str, body: Obj) -> None:
        """Admission: service accounts, PriorityClasses, Kueue's Job webhook."""
        if res.plural == "pods":
            spec = body.get("spec") or {}
            sa = spec.get("serviceAccountName") or "default"
            if sa != "default" and self.store.find("serviceaccounts", ns, sa) is None:
                raise ApiError(
                    403,
                    f'pods "{body["metadata"].get("name")}" is forbidden: error looking up '
                    f'service account {ns}/{sa}: serviceaccount "{sa}" not found',
                )
            pc = spec.get("priorityClassName")
            if pc:
                found = self.store.find("priorityclasses", "", pc)
                if found is None:
                    raise ApiError(
                        403,
                        f'pods "{body["metadata"].get("name")}" is forbidden: no PriorityClass '
                        f"with name {pc} was found",
                    )
                spec["priority"] = found.get("value", 0)
        if res.plural == "jobs":
            labels = body["metadata"].get("labels") or {}
            if labels.get(KUEUE_QUEUE_LABEL):
                body.setdefault("spec", {})["suspend"] = True  # Kueue's Job webhook

    def defaults(self, res: Resource, body: Obj) -> None:
        """The API server's defaults for the fields the code reads back."""
        meta, spec = body["metadata"], body.setdefault("spec", {})
        if res.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            body["status"] = {"phase": "Active"}
            body.pop("spec", None)
        elif res.plural == "pods":
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("serviceAccountName", "default")
            for c in spec.get("containers") or []:
                c.setdefault("terminationMessagePath", "/dev/termination-log")
                c.setdefault("terminationMessagePolicy", "File")
            body["status"] = {"phase": "Pending", "conditions": []}
        elif res.plural == "jobs":
            spec.setdefault("parallelism", 1)
            spec.setdefault("completions", 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            body["status"] = {}
        elif res.plural == "services":
            if spec.get("clusterIP") != "None":
                spec["clusterIP"] = self.next_cluster_ip()
            spec.setdefault("type", "ClusterIP")
            for p in spec.get("ports") or []:
                p.setdefault("protocol", "TCP")
                p.setdefault("targetPort", p.get("port"))
        elif res.plural == "persistentvolumeclaims":
            spec.setdefault("volumeMode", "Filesystem")
            body["status"] = {"phase": "Pending"}
        elif res.plural == "deployments":
            spec.setdefault("replicas", 1)
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault(
                "strategy",
                {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            )
            body["status"] = {}
        elif not spec:
            body.pop("spec", None)

    def modify(
        self,
        res: Resource,
        ns: str,
        name: str,
        sub: str,
        verb: str,
        body: Any,
        content_type: str,
        dry_run: bool = False,
    ) -> Obj:
        """PUT or PATCH an object (or its ``status``), enforcing the immutable fields."""
        current = self.store.get(res.plural, ns, name)
        if verb == "update":
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be an object")
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {res.plural} "{name}": the object has '
                    "been modified; please apply your changes to the latest version",
                    reason="Conflict",
                )
            new = copy.deepcopy(body)
        elif content_type == "application/json-patch+json":
            new = json_patch(current, body)
        elif content_type in ("application/merge-patch+json", "application/apply-patch+yaml"):
            new = merge_patch(current, body)
        elif content_type == "application/strategic-merge-patch+json":
            new = merge_patch(current, body, strategic=True)
        else:
            raise ApiError(415, f"unsupported patch type {content_type!r}")
        for key in ("uid", "creationTimestamp", "name", "namespace", "generation"):
            if key in current["metadata"]:
                new.setdefault("metadata", {})[key] = current["metadata"][key]
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        if sub == "status":
            merged = copy.deepcopy(current)
            merged["status"] = new.get("status", {})
            new = merged
        else:
            new["status"] = current.get("status", {})
            self._check_immutable(res, current, new)
            if res.plural != "events":
                from trainyard.k8s import checks

                probe = copy.deepcopy(new)
                probe.pop("status", None)
                for key in ("uid", "creationTimestamp", "resourceVersion", "generation"):
                    probe["metadata"].pop(key, None)
                invalid = [e for e in checks.validate_object(probe) if "no schema for" not in e]
                path = checks.POD_TEMPLATE_PATHS.get(new["kind"])
                if path is not None:
                    spec: Any = probe
                    for key in path:
                        spec = (spec or {}).get(key)
                    pss = set(
                        checks.pss_violations(spec or {}, f"{new['kind']}/{name} {'.'.join(path)}")
                    )
                    invalid = [e for e in invalid if e not in pss]
                if invalid:
                    raise ApiError(422, f'{new["kind"]} "{name}" is invalid: ' + "; ".join(invalid))
        if dry_run:
            return new

        def replace(obj: Obj) -> None:
            rv_now = obj["metadata"].get("resourceVersion")
            obj.clear()
            obj.update(new)
            obj["metadata"]["resourceVersion"] = rv_now

        return self.store.update(res.plural, ns, name, replace)

    @staticmethod
    def _check_immutable(res: Resource, current: Obj, new: Obj) -> None:
        name = current["metadata"]["name"]
        if res.plural == "jobs":
            was, now_ = current.get("spec", {}), new.get("spec", {})
            for field in ("completions", "completionMode", "selector"):
                if was.get(field) != now_.get(field):
                    raise ApiError(
                        422, f'Job.batch "{name}" is invalid: spec.{field}: field is immutable'
                    )
            if was.get("template") != now_.get("template") and not was.get("suspend"):
                raise ApiError(
                    422, f'Job.batch "{name}" is invalid: spec.template: field is immutable'
                )
        if res.plural == "pods":
            was, now_ = dict(current.get("spec", {})), dict(new.get("spec", {}))
            for field in ("activeDeadlineSeconds", "tolerations"):
                was.pop(field, None)
                now_.pop(field, None)
            if was != now_:
                raise ApiError(
                    422,
                    f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change '
                    "fields other than spec.containers[*].image, activeDeadlineSeconds and "
                    "tolerations",
                )

    def delete(self, res: Resource, ns: str, name: str, opts: dict[str, Any], dry: bool) -> Obj:
        """DELETE with the API server's propagation rules.

        Pods end gracefully (SIGTERM, the grace period, SIGKILL) and go once their
        processes are gone. ``Foreground``: the object stays, marked, until the garbage
        collector has removed its dependents; ``Background``: it goes now, its dependents
        after; ``Orphan`` (a Job's default): its dependents stay, without the owner.
        """
        obj = self.store.get(res.plural, ns, name)
        if dry:
            return obj
        if res.plural == "pods":
            grace = opts.get("gracePeriodSeconds")
            return self.kubelet.delete_pod(ns, name, None if grace is None else int(grace))
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        policy = opts.get("propagationPolicy")
        if policy is None and opts.get("orphanDependents"):
            policy = "Orphan"
        policy = policy or DEFAULT_GC.get(res.plural, "Background")
        if policy == "Foreground":

            def mark(o: Obj) -> None:
                o["metadata"]["deletionTimestamp"] = now()
                fins = o["metadata"].setdefault("finalizers", [])
                if "foregroundDeletion" not in fins:
                    fins.append("foregroundDeletion")

            return self.store.update(res.plural, ns, name, mark)
        if policy == "Orphan":
            uid = meta["uid"]
            for dep_plural, dep in self.dependents(uid):
                dm = dep["metadata"]

                def unown(o: Obj, uid: str = uid) -> None:
                    refs = [
                        r for r in o["metadata"].get("ownerReferences") or [] if r["uid"] != uid
                    ]
                    o["metadata"]["ownerReferences"] = refs or None
                    if not refs:
                        o["metadata"].pop("ownerReferences")

                self.store.update(dep_plural, dm.get("namespace", ""), dm["name"], unown)
        self.store.remove(res.plural, ns, name)
        out = status_ok()
        out["details"] = {"name": name, "kind": res.plural, "uid": meta["uid"]}
        return out

    def dependents(self, uid: str) -> list[tuple[str, Obj]]:
        """Every object an ownerReference ties to ``uid``: (plural, object)."""
        with self.store.lock:
            return [
                (plural, copy.deepcopy(o))
                for (plural, _, _), o in self.store.objects.items()
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
            ]

    def event(self, obj: Obj, reason: str, message: str, type_: str = "Normal") -> None:
        """Record an Event about an object (what ``kubectl describe`` shows)."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        body = {
            "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid"),
                "apiVersion": obj.get("apiVersion"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "localkube"},
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "count": 1,
        }
        if self.store.find("namespaces", "", ns) is not None:
            self.store.create(BY_PATH[("", "v1", "events")], ns, body)

    def network_file(self) -> Path:
        return self.state_dir / "network.json"

    def write_json(self, path: Path, doc: Any) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True))
        tmp.replace(path)


def _job_labels(job: Obj) -> None:
    """The labels the Job controller gives a Job's selector and pod template."""
    meta, spec = job["metadata"], job["spec"]
    uid, name = meta["uid"], meta["name"]
    own = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **own}
    meta["labels"] = {**own, **(meta.get("labels") or {})}
