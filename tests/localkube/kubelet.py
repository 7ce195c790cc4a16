"""The kubelet: a pod's containers as local processes, their states, logs, probes and exec.

A container runs through the project's pods-as-processes mapping
(:func:`trainyard.k8s.local.local_process`: command, args and environment as rendered,
each mount mapped to a local folder). The pod of an Indexed training Job runs as the
launcher runs it (:func:`trainyard.training.launcher.pod_task` and
:func:`~trainyard.training.launcher.task_env`): the headless Service's DNS names of the
attempt map to loopback ports, and the loopback preload library keeps its binds there.

The KubernetesPodOperator's XCom sidecar (``airflow-xcom-sidecar``, an alpine ``sh`` loop)
is emulated: it "runs" until an exec sends it the kill the operator sends; an exec of
``sh -c <script>`` into it runs the script with ``/airflow/xcom`` mapped to the folder the
pod's main container writes its result to.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.localkube.api import Handler, stamped, websocket_accept
from tests.localkube.store import ApiError, Obj, now, truthy

if TYPE_CHECKING:
    from tests.localkube.cluster import LocalCluster

SIDECAR = "airflow-xcom-sidecar"
NODE = "localkube-node"
IMAGE_BIN = Path(__file__).resolve().parent / "image" / "bin"
PODNET = Path(__file__).resolve().parent / "podnet"


def rfc3339nano() -> str:
    t = dt.datetime.now(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond:06d}000Z"


def _typed(data: Obj, kind: str) -> Any:
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(copy.deepcopy(data), kind)  # type: ignore[attr-defined]


class ContainerLog:
    """A container's output: timestamped lines, and whether the container ended."""

    def __init__(self, path: Path) -> None:
        self.lines: list[tuple[float, str, bytes]] = []
        self.done = False
        self.cond = threading.Condition()
        self.file = path.open("ab")

    def add(self, line: bytes) -> None:
        with self.cond:
            self.lines.append((time.time(), rfc3339nano(), line))
            if not self.file.closed:
                self.file.write(line)
                self.file.flush()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.file.close()

    def finish(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()


@dataclass
class Container:
    """One container of a running pod."""

    name: str
    log: ContainerLog
    proc: subprocess.Popen[bytes] | None = None
    local: Any = None  # trainyard.k8s.local.LocalProcess
    emulated: bool = False
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    message: str = ""
    restarts: int = 0
    ready: bool = False
    killed: bool = False


@dataclass
class PodRuntime:
    """A pod the kubelet runs."""

    ns: str
    name: str
    uid: str
    spec: Obj
    scratch: Path
    containers: dict[str, Container] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    named_ports: dict[str, int] = field(default_factory=dict)
    terminating: bool = False
    started: threading.Event = field(default_factory=threading.Event)
    next_probe: float = 0.0


class Kubelet:
    """Runs every scheduled pod of the cluster as processes; reports their status."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.store = cluster.store
        self.pods: dict[tuple[str, str], PodRuntime] = {}
        self.lock = threading.RLock()
        self.training_ports: dict[tuple[str, str], int] = {}
        self._guard: dict[str, str] | None = None

    # ------------------------------------------------------------------ scheduling

    def sync(self) -> None:
        """Schedule pending pods, start scheduled ones, publish every pod's status."""
        for pod in self.store.list("pods"):
            self.sync_pod(pod)
        with self.lock:
            runtimes = list(self.pods.values())
        for rt in runtimes:
            self._probe(rt)
            self._publish(rt)

    def sync_pod(self, pod: Obj) -> None:
        """Schedule a pod (its claims bound) and start it (also called as it is created)."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        if not pod["spec"].get("nodeName"):
            if not self._schedule(pod):
                return
            pod = self.store.get("pods", meta["namespace"], meta["name"])
        with self.lock:
            if (meta["namespace"], meta["name"]) in self.pods:
                return
        if pod["status"].get("phase") == "Pending":
            self._start(pod)

    def _schedule(self, pod: Obj) -> bool:
        meta, spec = pod["metadata"], pod["spec"]
        ns = meta["namespace"]
        missing = []
        for vol in spec.get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                pvc = self.store.find("persistentvolumeclaims", ns, claim)
                if pvc is None or (pvc.get("status") or {}).get("phase") != "Bound":
                    missing.append(claim)
        if missing:
            why = f'persistentvolumeclaim "{missing[0]}" not found or not bound'
            conds = pod["status"].get("conditions") or []
            if not any(c.get("reason") == "Unschedulable" for c in conds):
                self.store.update(
                    "pods",
                    ns,
                    meta["name"],
                    lambda o: o["status"].update(
                        conditions=[
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": f"0/1 nodes are available: {why}.",
                            }
                        ]
                    ),
                )
                self.cluster.event(pod, "FailedScheduling", f"0/1 nodes are available: {why}.")
            return False

        def bind(o: Obj) -> None:
            o["spec"]["nodeName"] = NODE
            o["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
            ]

        self.store.update("pods", ns, meta["name"], bind)
        self.cluster.event(pod, "Scheduled", f"Successfully assigned {ns}/{meta['name']} to {NODE}")
        return True

    # ------------------------------------------------------------------- starting

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        scratch = self.cluster.state_dir / "pods" / f"{ns}_{name}"
        scratch.mkdir(parents=True, exist_ok=True)
        rt = PodRuntime(ns, name, meta["uid"], pod["spec"], scratch)
        with self.lock:
            if (ns, name) in self.pods:  # started by another thread meanwhile
                return
            self.pods[(ns, name)] = rt
        from trainyard.training.launcher import free_ports

        ports = [p for c in pod["spec"].get("containers") or [] for p in c.get("ports") or []]
        local = free_ports(len(ports)) if ports else []
        for p, lp in zip(ports, local, strict=True):
            rt.ports[int(p["containerPort"])] = lp
            if p.get("name"):
                rt.named_ports[p["name"]] = lp
        for c in pod["spec"].get("containers") or []:
            log = ContainerLog(scratch / f"{c['name']}.log")
            rt.containers[c["name"]] = Container(c["name"], log)
        try:
            for c in pod["spec"].get("containers") or []:
                self._run_container(rt, pod, c["name"])
        except Exception as e:  # the container cannot start: it fails, as a bad image would
            for ctr in rt.containers.values():
                if ctr.proc is None and not ctr.emulated and ctr.exit_code is None:
                    ctr.exit_code, ctr.message = 128, f"localkube cannot start it: {e}"
                    ctr.started_at = ctr.finished_at = now()
                    ctr.log.add(f"{ctr.message}\n".encode())
                    ctr.log.finish()
        rt.started.set()
        self._publish(rt)

    def _downward(self, pod: Obj, container: Obj) -> dict[str, str]:
        """The container's ``valueFrom.fieldRef`` variables (the downward API)."""
        out = {}
        meta = pod["metadata"]
        for var in container.get("env") or []:
            ref = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if not ref:
                continue
            m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", ref)
            if m:
                value = (meta.get(m[1]) or {}).get(m[2], "")
            else:
                value = {
                    "metadata.name": meta["name"],
                    "metadata.namespace": meta["namespace"],
                    "metadata.uid": meta["uid"],
                    "status.podIP": "127.0.0.1",
                    "spec.nodeName": NODE,
                    "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                }.get(ref, "")
            out[var["name"]] = value
        return out

    def _image_env(self, rt: PodRuntime) -> dict[str, str]:
        env = dict(self.cluster.image_env)
        env["PATH"] = os.pathsep.join([str(IMAGE_BIN), env.get("PATH", os.environ["PATH"])])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PODNET), env.get("PYTHONPATH")) if p)
        env["LOCALKUBE_NETWORK"] = str(self.cluster.network_file())
        env["LOCALKUBE_NAMESPACE"] = rt.ns
        env["LOCALKUBE_PORTS"] = json.dumps({str(k): v for k, v in rt.ports.items()})
        return env

    def _run_container(self, rt: PodRuntime, pod: Obj, cname: str) -> None:
        from trainyard.k8s.local import local_process

        ctr = rt.containers[cname]
        spec = copy.deepcopy(pod["spec"])
        container = next(c for c in spec["containers"] if c["name"] == cname)
        if cname == SIDECAR:
            ctr.emulated, ctr.started_at = True, now()
            return
        spec["containers"] = [container]
        typed = _typed(spec, "V1PodSpec")
        scratch = rt.scratch / cname
        extra = self._downward(pod, container)
        training = self._training_env(pod, typed, scratch)
        if training is not None:
            argv, env, ctr.local = training
        else:
            ctr.local = local_process(
                typed,
                volume_root=self.cluster.volume_root,
                scratch=scratch,
                settings=self.cluster.settings,
                base_env=self._image_env(rt),
                extra_env=extra,
            )
            argv, env = ctr.local.argv, ctr.local.env
            env["LOCALKUBE_PATHS"] = json.dumps(ctr.local.paths)  # the pod's mounts
        ctr.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=str(scratch),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        ctr.started_at, ctr.exit_code, ctr.finished_at = now(), None, None
        threading.Thread(
            target=self._pump, args=(rt, ctr), name=f"pod-{rt.name}-{cname}", daemon=True
        ).start()

    def _training_env(
        self, pod: Obj, typed_spec: Any, scratch: Path
    ) -> tuple[list[str], dict[str, str], Any] | None:
        """A training Job's pod, as the launcher runs it: (argv, env, its LocalProcess)."""
        from trainyard.k8s.local import local_process
        from trainyard.training import spec as tspec
        from trainyard.training.launcher import TaskSpec, free_ports, loopback_env, task_env

        container = typed_spec.containers[0]
        env = {v.name: v.value for v in container.env or [] if v.value is not None}
        if tspec.ENV_JOBS not in env:
            return None
        meta, ns = pod["metadata"], pod["metadata"]["namespace"]
        index = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        jobs = json.loads(env[tspec.ENV_JOBS])
        service = env[tspec.ENV_SERVICE]
        rt = self.pods[(ns, meta["name"])]
        proc = local_process(
            typed_spec,
            volume_root=self.cluster.volume_root,
            scratch=scratch,
            settings=self.cluster.settings,
            base_env=self._image_env(rt),
            extra_env={
                tspec.ENV_INDEX: str(index),
                **self._downward(pod, pod["spec"]["containers"][0]),
            },
        )
        hosts = {}
        # the headless Service's names resolve only while it exists (publishNotReadyAddresses)
        if self.store.find("services", ns, service) is not None:
            names = [
                f"{j['job']}-{i}.{service}" for j in jobs.values() for i in range(j["replicas"])
            ]
            with self.lock:
                missing = [n for n in names if (ns, n) not in self.training_ports]
                for n, p in zip(missing, free_ports(len(missing)), strict=True):
                    self.training_ports[(ns, n)] = p
                hosts = {n: f"127.0.0.1:{self.training_ports[(ns, n)]}" for n in names}
        if self._guard is None:
            self._guard = loopback_env(lambda _m: None)
        dns = f"{typed_spec.hostname}.{typed_spec.subdomain}"
        task = TaskSpec(meta["name"], proc.argv, proc.env, dns)
        return proc.argv, task_env(task, hosts, self._guard), proc

    def release_training_ports(self, ns: str, service: str) -> None:
        with self.lock:
            for key in [
                k for k in self.training_ports if k[0] == ns and k[1].endswith(f".{service}")
            ]:
                del self.training_ports[key]

    def _pump(self, rt: PodRuntime, ctr: Container) -> None:
        proc = ctr.proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            ctr.log.add(line)
        code = proc.wait()
        message = ""
        if ctr.local is not None:
            from trainyard.k8s.local import TERMINATION_LOG

            path = ctr.local.local(TERMINATION_LOG)
            if path.is_file():
                message = path.read_text(encoding="utf-8", errors="replace").strip()[-4096:]
        ctr.exit_code = 128 - code if code < 0 else code  # a signal: 128 + its number
        ctr.message, ctr.finished_at, ctr.ready = message, now(), False
        policy = rt.spec.get("restartPolicy", "Always")
        restart = not rt.terminating and (
            policy == "Always" or (policy == "OnFailure" and code != 0)
        )
        if restart:
            time.sleep(1)
            ctr.restarts += 1
            pod = self.store.find("pods", rt.ns, rt.name)
            if pod is not None and not rt.terminating:
                self._run_container(rt, pod, ctr.name)
        else:
            ctr.log.finish()
        with self.store.changed:
            self.store.changed.notify_all()

    # --------------------------------------------------------------------- status

    def _probe(self, rt: PodRuntime) -> None:
        if time.monotonic() < rt.next_probe:
            return
        rt.next_probe = time.monotonic() + 1.0
        for c in rt.spec.get("containers") or []:
            ctr = rt.containers.get(c["name"])
            if ctr is None:
                continue
            running = (ctr.emulated and ctr.exit_code is None) or (
                ctr.proc is not None and ctr.exit_code is None
            )
            probe = c.get("readinessProbe")
            if not running:
                ctr.ready = False
            elif not probe:
                ctr.ready = True
            elif probe.get("httpGet"):
                get = probe["httpGet"]
                port = self._port(rt, get.get("port"))
                url = f"http://127.0.0.1:{port}{get.get('path', '/')}"
                try:
                    with urllib.request.urlopen(url, timeout=1) as resp:
                        ctr.ready = 200 <= resp.status < 400
                except (urllib.error.URLError, OSError, ValueError):
                    ctr.ready = False
            elif probe.get("tcpSocket"):
                import socket

                port = self._port(rt, probe["tcpSocket"].get("port"))
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    ctr.ready = True
                except OSError:
                    ctr.ready = False
            else:
                ctr.ready = True

    @staticmethod
    def _port(rt: PodRuntime, port: Any) -> int:
        if isinstance(port, str) and not port.isdigit():
            return rt.named_ports.get(port, 1)
        return rt.ports.get(int(port), int(port))

    def _publish(self, rt: PodRuntime) -> None:
        statuses = []
        for c in rt.spec.get("containers") or []:
            ctr = rt.containers.get(c["name"])
            if ctr is None:
                continue
            if ctr.exit_code is not None and not (ctr.proc and ctr.proc.poll() is None):
                state = {
                    "terminated": {
                        "exitCode": ctr.exit_code,
                        "reason": "Completed" if ctr.exit_code == 0 else "Error",
                        "message": ctr.message or None,
                        "startedAt": ctr.started_at,
                        "finishedAt": ctr.finished_at,
                        "containerID": f"localkube://{rt.uid}/{ctr.name}",
                    }
                }
                state["terminated"] = {
                    k: v for k, v in state["terminated"].items() if v is not None
                }
            elif ctr.started_at:
                state = {"running": {"startedAt": ctr.started_at}}
            else:
                state = {"waiting": {"reason": "ContainerCreating"}}
            statuses.append(
                {
                    "name": ctr.name,
                    "image": c.get("image", ""),
                    "imageID": c.get("image", ""),
                    "ready": ctr.ready,
                    "started": "running" in state,
                    "restartCount": ctr.restarts,
                    "state": state,
                }
            )
        ended = [s for s in statuses if "terminated" in s["state"]]
        if statuses and len(ended) == len(statuses):
            ok = all(s["state"]["terminated"]["exitCode"] == 0 for s in ended)
            phase = "Succeeded" if ok else "Failed"
        elif any("running" in s["state"] or "terminated" in s["state"] for s in statuses):
            phase = "Running"
        else:
            phase = "Pending"
        ready = bool(statuses) and all(s["ready"] for s in statuses)

        def write(o: Obj) -> None:
            st = o["status"]
            conds = {c["type"]: c for c in st.get("conditions") or []}
            for ctype, value in (
                ("PodScheduled", True),
                ("Initialized", True),
                ("ContainersReady", ready),
                ("Ready", ready),
            ):
                old = conds.get(ctype)
                status = "True" if value else "False"
                if old is None or old.get("status") != status:
                    conds[ctype] = {"type": ctype, "status": status, "lastTransitionTime": now()}
            st.update(
                phase=phase,
                conditions=list(conds.values()),
                containerStatuses=statuses,
                hostIP="127.0.0.1",
                podIP="127.0.0.1",
                podIPs=[{"ip": "127.0.0.1"}],
            )
            st.setdefault("startTime", now())

        with contextlib.suppress(ApiError):
            self.store.update("pods", rt.ns, rt.name, write)

    # ------------------------------------------------------------------- deletion

    def delete_pod(self, ns: str, name: str, grace: int | None) -> Obj:
        """Delete a pod gracefully: it goes once its processes have ended."""
        pod = self.store.get("pods", ns, name)
        if pod["metadata"].get("deletionTimestamp"):
            return pod
        with self.lock:
            rt = self.pods.get((ns, name))
        if rt is None or pod["status"].get("phase") in ("Succeeded", "Failed"):
            if rt is not None:
                self._kill(rt, 0)
            self._forget(ns, name)
            self.store.remove("pods", ns, name)
            return stamped(pod)
        seconds = (
            grace
            if grace is not None
            else int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        )

        def mark(o: Obj) -> None:
            o["metadata"]["deletionTimestamp"] = now()
            o["metadata"]["deletionGracePeriodSeconds"] = seconds

        marked = self.store.update("pods", ns, name, mark)
        self.cluster.event(pod, "Killing", "Stopping container(s)")

        def finish() -> None:
            self._kill(rt, seconds)
            self._forget(ns, name)
            self.store.remove("pods", ns, name)

        threading.Thread(target=finish, name=f"delete-{name}", daemon=True).start()
        return marked

    def _kill(self, rt: PodRuntime, grace: float) -> None:
        rt.terminating = True
        rt.started.wait(timeout=30)
        procs = [c.proc for c in rt.containers.values() if c.proc is not None]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
                    os.killpg(p.pid, signal.SIGCONT)  # a paused process gets it too
        end = time.monotonic() + grace
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for c in rt.containers.values():
            if c.emulated and c.exit_code is None:
                c.exit_code, c.finished_at = 137, now()
            c.log.finish()

    def _forget(self, ns: str, name: str) -> None:
        with self.lock:
            rt = self.pods.pop((ns, name), None)
        if rt is not None:
            for c in rt.containers.values():
                c.log.close()

    def signal_pod(self, ns: str, name: str, sig: int) -> None:
        """Send a signal to every process of a pod (tests: ``SIGSTOP`` pauses a slow node)."""
        with self.lock:
            rt = self.pods[(ns, name)]
        for c in rt.containers.values():
            if c.proc is not None and c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, sig)

    def stop_all(self) -> None:
        """SIGKILL every pod's processes (the cluster is going away)."""
        with self.lock:
            runtimes = list(self.pods.values())
        for rt in runtimes:
            self._kill(rt, 0)
            self._forget(rt.ns, rt.name)

    def processes(self) -> list[int]:
        """Pids of the pods' processes still running (tests: none after teardown)."""
        with self.lock:
            return [
                c.proc.pid
                for rt in self.pods.values()
                for c in rt.containers.values()
                if c.proc is not None and c.proc.poll() is None
            ]

    # ------------------------------------------------------------------------ logs

    def serve_log(self, h: Handler, ns: str, name: str, query: dict[str, str]) -> None:
        pod = self.store.get("pods", ns, name)
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        cname = query.get("container")
        if not cname:
            if len(names) != 1:
                raise ApiError(
                    400,
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(names)}]",
                )
            cname = names[0]
        if cname not in names:
            raise ApiError(400, f"container {cname} is not valid for pod {name}")
        with self.lock:
            rt = self.pods.get((ns, name))
        ctr = rt.containers.get(cname) if rt else None
        if ctr is None or not ctr.started_at:
            raise ApiError(
                400,
                f'container "{cname}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        follow = truthy(query.get("follow"))
        stamps = truthy(query.get("timestamps"))
        since = float(query["sinceSeconds"]) if query.get("sinceSeconds") else None
        tail = int(query["tailLines"]) if query.get("tailLines") else None
        cutoff = time.time() - since if since is not None else 0.0

        def render(entries: list[tuple[float, str, bytes]]) -> bytes:
            return b"".join(
                (f"{ts} ".encode() if stamps else b"") + line for _, ts, line in entries
            )

        with ctr.log.cond:
            entries = [e for e in ctr.log.lines if e[0] >= cutoff]
        if tail is not None:
            entries = entries[-tail:] if tail else []
        if not follow:
            data = render(entries)
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        h.start_chunks("text/plain")
        h.chunk(render(entries))
        seen = len(ctr.log.lines) if tail is None and since is None else None
        if seen is None:
            with ctr.log.cond:
                seen = len(ctr.log.lines)
        while True:
            with ctr.log.cond:
                if len(ctr.log.lines) == seen and not ctr.log.done:
                    ctr.log.cond.wait(timeout=1.0)
                new, seen = ctr.log.lines[seen:], len(ctr.log.lines)
                done = ctr.log.done and not new
            if new:
                h.chunk(render(new))
            if done or self.store.find("pods", ns, name) is None:
                break
        h.end_chunks()

    # ------------------------------------------------------------------------ exec

    def serve_exec(self, h: Handler, ns: str, name: str, query: dict[str, str], path: str) -> None:
        pod = self.store.get("pods", ns, name)
        command = parse_qs(urlsplit(path).query).get("command", [])
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        cname = query.get("container") or names[0]
        with self.lock:
            rt = self.pods.get((ns, name))
        ctr = rt.containers.get(cname) if rt else None
        if ctr is None or ctr.exit_code is not None:
            raise ApiError(400, f'unable to upgrade connection: container not found ("{cname}")')
        ws = websocket_accept(h)
        try:
            if ctr.emulated:
                self._sidecar_exec(rt, ctr, ws, command, truthy(query.get("stdin")))
            else:
                self._local_exec(ctr, ws, command)
        except (ConnectionError, OSError):
            pass
        finally:
            ws.close()

    def _xcom_dir(self, rt: PodRuntime) -> str:
        from trainyard.k8s.local import XCOM_DIR

        for c in rt.containers.values():
            if c.local is not None:
                return str(c.local.local(XCOM_DIR))
        return str(rt.scratch / "xcom")

    def _sidecar_exec(
        self, rt: PodRuntime, ctr: Container, ws: Any, command: list[str], stdin: bool
    ) -> None:
        from trainyard.k8s.local import XCOM_DIR

        if stdin:  # the operator's kill: a line on stdin of an interactive sh
            line = b""
            while b"\n" not in line:
                op, data = ws.recv()
                if op == 0x8:
                    return
                if data[:1] == b"\x00":
                    line += data[1:]
            if re.search(rb"\bkill\b", line):
                ctr.exit_code, ctr.finished_at = 0, now()  # its trap: exit 0 on SIGINT
                ctr.log.finish()
                with self.store.changed:
                    self.store.changed.notify_all()
                ws.channel(3, json.dumps({"metadata": {}, "status": "Success"}).encode())
                return
            command = ["/bin/sh", "-c", line.decode()]
        if command[:2] != ["/bin/sh", "-c"] or len(command) != 3:
            ws.channel(2, f"localkube: the XCom sidecar runs only sh -c, not {command}\n".encode())
            ws.channel(3, json.dumps({"status": "Failure", "message": "unsupported"}).encode())
            return
        script = command[2].replace(XCOM_DIR, self._xcom_dir(rt))
        out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, timeout=60)
        self._answer(ws, out.returncode, out.stdout, out.stderr)

    def _local_exec(self, ctr: Container, ws: Any, command: list[str]) -> None:
        from trainyard.k8s.local import map_value

        argv = [map_value(a, ctr.local.paths) for a in command]
        out = subprocess.run(argv, capture_output=True, env=ctr.local.env, timeout=120)
        self._answer(ws, out.returncode, out.stdout, out.stderr)

    @staticmethod
    def _answer(ws: Any, code: int, stdout: bytes, stderr: bytes) -> None:
        if stdout:
            ws.channel(1, stdout)
        if stderr:
            ws.channel(2, stderr)
        if code == 0:
            ws.channel(3, json.dumps({"metadata": {}, "status": "Success"}).encode())
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
            ws.channel(3, json.dumps(status).encode())
