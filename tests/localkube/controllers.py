"""Controllers: Jobs, Kueue admission, Deployments, PVCs, VolumeSnapshots, GC, the network.

Each runs on every change of the store (and at least every 0.2 s), reading objects and
writing back through the store, as Kubernetes' controllers do through the API.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from tests.localkube.store import BY_PATH, ApiError, Obj, match_labels, now, parse_time

if TYPE_CHECKING:
    from tests.localkube.cluster import LocalCluster

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
HASH_LABEL = "pod-template-hash"
TERMINAL = ("Succeeded", "Failed")


def owner_ref(obj: Obj) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_by(obj: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def compress(indexes: list[int]) -> str:
    """``completedIndexes``: ``0-2,4``."""
    out, run = [], []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _cond(status: Obj, ctype: str, reason: str = "", message: str = "") -> None:
    conds = status.setdefault("conditions", [])
    if not any(c["type"] == ctype for c in conds):
        conds.append(
            {
                "type": ctype,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": now(),
                "lastTransitionTime": now(),
            }
        )


def _has(status: Obj, ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in status.get("conditions") or [])


class Controllers:
    """The cluster's controllers (see the module docstring)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.store = cluster.store
        self._network = ""

    def reconcile(self) -> None:
        self.volumes()
        self.kueue()
        self.jobs()
        self.deployments()
        self.snapshots()
        self.garbage()
        self.cluster.kubelet.sync()
        self.network()

    # ----------------------------------------------------------------- storage

    def volumes(self) -> None:
        for pvc in self.store.list("persistentvolumeclaims"):
            if pvc["status"].get("phase") == "Bound":
                continue
            meta, spec = pvc["metadata"], pvc["spec"]
            sc = spec.get("storageClassName")
            if sc and self.store.find("storageclasses", "", sc) is None:
                continue  # stays Pending: no provisioner for that class

            def bind(o: Obj) -> None:
                o["spec"]["volumeName"] = f"pvc-{o['metadata']['uid']}"
                o["status"] = {
                    "phase": "Bound",
                    "accessModes": o["spec"].get("accessModes"),
                    "capacity": o["spec"]["resources"]["requests"],
                }

            self.store.update("persistentvolumeclaims", meta["namespace"], meta["name"], bind)

    def snapshots(self) -> None:
        for snap in self.store.list("volumesnapshots"):
            status = snap.get("status") or {}
            if status.get("readyToUse") or status.get("error"):
                continue
            meta, spec = snap["metadata"], snap["spec"]
            cls = spec.get("volumeSnapshotClassName")
            claim = spec["source"].get("persistentVolumeClaimName")
            pvc = self.store.find("persistentvolumeclaims", meta["namespace"], claim or "")
            if cls and self.store.find("volumesnapshotclasses", "", cls) is None:
                new = {
                    "error": {"message": f'volumesnapshotclass "{cls}" not found', "time": now()}
                }
            elif pvc is None:
                new = {
                    "error": {
                        "message": f'persistentvolumeclaim "{claim}" not found',
                        "time": now(),
                    }
                }
            else:
                new = {
                    "readyToUse": True,
                    "restoreSize": pvc["spec"]["resources"]["requests"]["storage"],
                    "boundVolumeSnapshotContentName": f"snapcontent-{meta['uid']}",
                    "creationTime": now(),
                }
            self.store.update(
                "volumesnapshots",
                meta["namespace"],
                meta["name"],
                lambda o, n=new: o.update(status=n),
            )

    # ------------------------------------------------------------------- kueue

    def kueue(self) -> None:
        """Admit suspended Jobs of a LocalQueue whose ClusterQueue admits (no stopPolicy)."""
        for job in self.store.list("jobs"):
            meta, spec = job["metadata"], job["spec"]
            queue = (meta.get("labels") or {}).get(QUEUE_LABEL)
            if not queue or not spec.get("suspend") or meta.get("deletionTimestamp"):
                continue
            if (meta.get("annotations") or {}).get("localkube/admitted"):
                continue
            ns = meta["namespace"]
            lq = self.store.find("localqueues", ns, queue)
            cq = lq and self.store.find("clusterqueues", "", lq["spec"].get("clusterQueue", ""))
            if not lq or not cq:
                continue  # inadmissible: stays suspended, as under Kueue
            if any((q.get("spec") or {}).get("stopPolicy", "None") != "None" for q in (lq, cq)):
                continue
            wpc = (meta.get("labels") or {}).get(PRIORITY_LABEL)
            if wpc and self.store.find("workloadpriorityclasses", "", wpc) is None:
                continue
            namespace = self.store.find("namespaces", "", ns) or {"metadata": {}}
            selector = (cq["spec"].get("namespaceSelector") or {}).get("matchLabels")
            if selector and not match_labels(selector, namespace["metadata"].get("labels")):
                continue
            flavors = [
                f["name"] for g in cq["spec"].get("resourceGroups") or [] for f in g["flavors"]
            ]
            flavor = self.store.find("resourceflavors", "", flavors[0]) if flavors else None
            node_labels = (flavor or {}).get("spec", {}).get("nodeLabels") or {}

            def admit(
                o: Obj, node_labels: dict[str, str] = node_labels, cq: str = cq["metadata"]["name"]
            ) -> None:
                o["spec"]["suspend"] = False
                pod = o["spec"]["template"].setdefault("spec", {})
                pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **node_labels}
                o["metadata"].setdefault("annotations", {})["localkube/admitted"] = cq

            self.store.update("jobs", ns, meta["name"], admit)
            self.cluster.event(job, "Started", f"Admitted by clusterQueue {cq['metadata']['name']}")

    # -------------------------------------------------------------------- jobs

    def jobs(self) -> None:
        pods = self.store.list("pods")
        for job in self.store.list("jobs"):
            try:
                self._job(job, [p for p in pods if owned_by(p, job["metadata"]["uid"])])
            except ApiError as e:
                if e.code != 404:
                    raise

    def _job(self, job: Obj, pods: list[Obj]) -> None:
        meta, spec, status = job["metadata"], job["spec"], dict(job.get("status") or {})
        ns, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp"):
            return  # the garbage collector ends its pods; its status stays as it was
        status = copy.deepcopy(status)
        finished = _has(status, "Complete") or _has(status, "Failed")
        if finished:
            ttl = spec.get("ttlSecondsAfterFinished")
            done_at = status.get("completionTime") or next(
                (
                    c["lastTransitionTime"]
                    for c in status.get("conditions") or []
                    if c["type"] == "Failed"
                ),
                None,
            )
            if ttl is not None and done_at and time.time() - parse_time(done_at).timestamp() > ttl:
                self.cluster.delete(BY_PATH[("batch", "v1", "jobs")], ns, name,
                                    {"propagationPolicy": "Background"}, False)  # fmt: skip
            return
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        active = [p for p in live if p["status"].get("phase") not in TERMINAL]
        failed = [p for p in pods if p["status"].get("phase") == "Failed"]
        indexed = spec.get("completionMode") == "Indexed"
        succeeded_idx = sorted(
            {
                int(p["metadata"]["annotations"][INDEX_LABEL])
                for p in pods
                if p["status"].get("phase") == "Succeeded" and indexed
            }
        )
        succeeded = (
            len(succeeded_idx)
            if indexed
            else sum(p["status"].get("phase") == "Succeeded" for p in pods)
        )
        completions = spec.get("completions", 1)
        status.update(
            active=len(active),
            ready=sum(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions") or []
                )
                for p in active
            ),
            failed=len(failed),
            succeeded=succeeded,
            terminating=len(pods) - len(live),
        )
        if indexed:
            status["completedIndexes"] = compress(succeeded_idx)
        if spec.get("suspend"):
            _cond(status, "Suspended", "JobSuspended", "Job suspended")
            for p in active:
                self.cluster.delete(
                    BY_PATH[("", "v1", "pods")], ns, p["metadata"]["name"], {}, False
                )
            self._write_status(ns, name, status)
            return
        status["conditions"] = [
            c for c in status.get("conditions") or [] if c["type"] != "Suspended"
        ]
        status.setdefault("startTime", now())
        deadline = spec.get("activeDeadlineSeconds")
        failure = ""
        if len(failed) > spec.get("backoffLimit", 6):
            failure, reason = "Job has reached the specified backoff limit", "BackoffLimitExceeded"
        elif deadline and time.time() - parse_time(status["startTime"]).timestamp() > deadline:
            failure, reason = "Job was active longer than specified deadline", "DeadlineExceeded"
        if failure or _has(status, "FailureTarget"):
            if failure:
                _cond(status, "FailureTarget", reason, failure)
            for p in active:  # the whole group stops: no pod of a failed Job keeps running
                self.cluster.delete(
                    BY_PATH[("", "v1", "pods")], ns, p["metadata"]["name"], {}, False
                )
            if not [p for p in pods if p["status"].get("phase") not in TERMINAL]:
                target = next(c for c in status["conditions"] if c["type"] == "FailureTarget")
                _cond(status, "Failed", target["reason"], target["message"])
                self.cluster.event(job, target["reason"], target["message"], "Warning")
            self._write_status(ns, name, status)
            return
        if succeeded >= completions:
            _cond(
                status,
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
            if not [p for p in pods if p["status"].get("phase") not in TERMINAL]:
                _cond(
                    status,
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                )
                status["completionTime"] = now()
                self.cluster.event(job, "Completed", "Job completed")
            self._write_status(ns, name, status)
            return
        self._write_status(ns, name, status)
        # create the missing pods
        want = spec.get("parallelism", 1)
        if indexed:
            busy = {int(p["metadata"]["annotations"][INDEX_LABEL]) for p in live
                    if p["status"].get("phase") != "Failed"}  # fmt: skip
            todo = [i for i in range(completions) if i not in busy and i not in succeeded_idx]
        else:
            todo = [None] * max(0, min(want, completions - succeeded) - len(active))
        for index in todo[: max(0, want - len(active))]:
            self._create_job_pod(job, index)

    def _create_job_pod(self, job: Obj, index: int | None) -> None:
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        ns, name = meta["namespace"], meta["name"]
        pod_meta = template.get("metadata") or {}
        pod_spec = template["spec"]
        stem = f"{name}-{index}" if index is not None else name
        pod_meta["name"] = f"{stem}-{secrets.token_hex(3)[:5]}"
        pod_meta["ownerReferences"] = [owner_ref(job)]
        if index is not None:
            pod_meta.setdefault("labels", {})[INDEX_LABEL] = str(index)
            pod_meta.setdefault("annotations", {})[INDEX_LABEL] = str(index)
            if pod_spec.get("subdomain"):
                pod_spec["hostname"] = stem
            for c in pod_spec.get("containers") or []:
                env = c.setdefault("env", [])
                if not any(v["name"] == "JOB_COMPLETION_INDEX" for v in env):
                    env.append(
                        {
                            "name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}
                            },
                        }
                    )
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}
        try:
            self.cluster.create(BY_PATH[("", "v1", "pods")], ns, body)
        except ApiError as e:
            self.cluster.event(job, "FailedCreate", f"Error creating: {e.message}", "Warning")
            return
        self.cluster.event(job, "SuccessfulCreate", f"Created pod: {pod_meta['name']}")

    def _write_status(self, ns: str, name: str, status: Obj) -> None:
        def write(o: Obj) -> None:
            o["status"] = status

        self.store.update("jobs", ns, name, write)

    # ------------------------------------------------------------- deployments

    def deployments(self) -> None:
        pods = self.store.list("pods")
        for dep in self.store.list("deployments"):
            if dep["metadata"].get("deletionTimestamp"):
                continue
            self._deployment(dep, [p for p in pods if owned_by(p, dep["metadata"]["uid"])])

    def _deployment(self, dep: Obj, pods: list[Obj]) -> None:
        meta, spec = dep["metadata"], dep["spec"]
        ns, name = meta["namespace"], meta["name"]
        template = spec["template"]
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        new = [p for p in live if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == digest]
        old = [p for p in live if p not in new]
        replicas = spec.get("replicas", 1)
        min_ready = spec.get("minReadySeconds", 0)

        def ready_since(p: Obj) -> float | None:
            for c in p["status"].get("conditions") or []:
                if c["type"] == "Ready" and c["status"] == "True":
                    return parse_time(c["lastTransitionTime"]).timestamp()
            return None

        def available(p: Obj) -> bool:
            since = ready_since(p)
            return since is not None and time.time() - since >= min_ready

        surge = 1
        if len(new) < replicas and len(live) < replicas + surge:
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    **copy.deepcopy(template.get("metadata") or {}),
                    "name": f"{name}-{digest}-{secrets.token_hex(3)[:5]}",
                    "ownerReferences": [owner_ref(dep)],
                },
                "spec": copy.deepcopy(template["spec"]),
            }
            body["metadata"].setdefault("labels", {})[HASH_LABEL] = digest
            try:
                self.cluster.create(BY_PATH[("", "v1", "pods")], ns, body)
            except ApiError as e:
                self.cluster.event(dep, "FailedCreate", f"Error creating: {e.message}", "Warning")
        new_available = [p for p in new if available(p)]
        if old and len(new_available) >= replicas:
            for p in old:
                self.cluster.delete(
                    BY_PATH[("", "v1", "pods")], ns, p["metadata"]["name"], {}, False
                )
        for p in new[replicas:]:
            self.cluster.delete(BY_PATH[("", "v1", "pods")], ns, p["metadata"]["name"], {}, False)
        status = copy.deepcopy(dep.get("status") or {})
        progressed = len(new_available) >= replicas and not old
        conds = {c["type"]: c for c in status.get("conditions") or []}
        if (
            progressed
            or "Progressing" not in conds
            or conds["Progressing"].get("observedGen") != meta["generation"]
        ):
            reason = "NewReplicaSetAvailable" if progressed else "ReplicaSetUpdated"
            if (
                conds.get("Progressing", {}).get("reason") != reason
                or conds["Progressing"].get("observedGen") != meta["generation"]
            ):
                conds["Progressing"] = {"type": "Progressing", "status": "True", "reason": reason,
                                        "lastUpdateTime": now(), "lastTransitionTime": now(),
                                        "observedGen": meta["generation"]}  # fmt: skip
        else:
            started = parse_time(conds["Progressing"]["lastUpdateTime"]).timestamp()
            if time.time() - started > spec.get("progressDeadlineSeconds", 600):
                conds["Progressing"] = {**conds["Progressing"], "status": "False",
                                        "reason": "ProgressDeadlineExceeded"}  # fmt: skip
        avail = sum(available(p) for p in live)
        conds["Available"] = {
            "type": "Available",
            "status": "True" if avail >= replicas else "False",
            "reason": "MinimumReplicasAvailable"
            if avail >= replicas
            else "MinimumReplicasUnavailable",
            "lastTransitionTime": conds.get("Available", {}).get("lastTransitionTime", now()),
        }
        status.update(
            observedGeneration=meta["generation"],
            replicas=len(live),
            updatedReplicas=len(new),
            readyReplicas=sum(ready_since(p) is not None for p in live),
            availableReplicas=avail,
            unavailableReplicas=max(0, len(live) - avail) or None,
            conditions=list(conds.values()),
        )
        status = {k: v for k, v in status.items() if v is not None}

        def write(o: Obj) -> None:
            o["status"] = status

        self.store.update("deployments", ns, name, write)

    # ------------------------------------------------------------------ garbage

    def garbage(self) -> None:
        """Foreground deletions finish once their dependents are gone; orphans go."""
        with self.store.lock:
            objects = [(k, copy.deepcopy(o)) for k, o in self.store.objects.items()]
        uids = {o["metadata"]["uid"] for _, o in objects}
        for (plural, ns, name), obj in objects:
            meta = obj["metadata"]
            refs = meta.get("ownerReferences") or []
            if refs and not any(r["uid"] in uids for r in refs):
                self._delete(plural, ns, name)
                continue
            if meta.get("deletionTimestamp") and "foregroundDeletion" in (
                meta.get("finalizers") or []
            ):
                deps = self.cluster.dependents(meta["uid"])
                for dep_plural, dep in deps:
                    if not dep["metadata"].get("deletionTimestamp"):
                        dm = dep["metadata"]
                        self._delete(dep_plural, dm.get("namespace", ""), dm["name"], "Foreground")
                if not deps:
                    self.store.remove(plural, ns, name)
                    if plural == "services":
                        self.cluster.kubelet.release_training_ports(ns, name)

    def _delete(self, plural: str, ns: str, name: str, policy: str = "Background") -> None:
        res = next(r for r in BY_PATH.values() if r.plural == plural)
        try:
            self.cluster.delete(res, ns, name, {"propagationPolicy": policy}, False)
        except ApiError as e:
            if e.code != 404:
                raise

    # ------------------------------------------------------------------ network

    def network(self) -> None:
        """The pod network's view of Services: name:port → ready endpoints' loopback ports."""
        kubelet = self.cluster.kubelet
        with kubelet.lock:
            runtimes = dict(kubelet.pods)
        pods = self.store.list("pods")
        table: dict[str, list[str]] = {}
        for svc in self.store.list("services"):
            meta, spec = svc["metadata"], svc["spec"]
            if spec.get("clusterIP") == "None" or not spec.get("selector"):
                continue
            ns, name = meta["namespace"], meta["name"]
            ready = [
                p
                for p in pods
                if p["metadata"]["namespace"] == ns
                and match_labels(spec["selector"], p["metadata"].get("labels"))
                and not p["metadata"].get("deletionTimestamp")
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions") or []
                )
            ]
            for port in spec.get("ports") or []:
                ends = []
                for p in ready:
                    rt = runtimes.get((ns, p["metadata"]["name"]))
                    if rt is not None:
                        ends.append(
                            f"127.0.0.1:{kubelet._port(rt, port.get('targetPort', port['port']))}"
                        )
                for host in (
                    name,
                    f"{name}.{ns}",
                    f"{name}.{ns}.svc",
                    f"{name}.{ns}.svc.cluster.local",
                ):
                    table[f"{host}:{port['port']}"] = ends
        text = json.dumps(table, sort_keys=True)
        if text != self._network:
            self._network = text
            self.cluster.write_json(self.cluster.network_file(), table)
