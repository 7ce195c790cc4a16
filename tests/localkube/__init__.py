"""localkube: a local Kubernetes API server for tests (a test double, never a runtime).

The kubernetes runner (``TRAINYARD_RUNNER=kubernetes``), the ``trainyard.k8s`` apply code
and the cncf-kubernetes operators talk to it unmodified through the real ``kubernetes``
client: only the transport is replaced. It answers the part of the API they use over HTTP
on loopback (REST verbs, ``?watch=true`` chunked watches, ``pods/log`` with ``follow``,
``pods/exec`` over the WebSocket channel protocol), validates every object on create with
the offline checks (:func:`trainyard.k8s.checks.validate_object`, Pod Security
"restricted" where the namespace enforces it), authorizes each request with the RBAC
Roles applied to it (``deploy/k8s/rbac.yaml``), and runs:

* pods as local processes through the project's pods-as-processes mapping
  (:mod:`trainyard.k8s.local`); an Indexed Job's pods get the launcher's DNS to loopback
  mapping of the headless Service (:func:`trainyard.training.launcher.task_env`);
* controllers for Jobs (Indexed, ``suspend``, ``backoffLimit``, ``activeDeadlineSeconds``,
  ``ttlSecondsAfterFinished``), Kueue admission (queue labels, ``stopPolicy``),
  Deployments (rolling updates, readiness probes), PVC binding, VolumeSnapshots and the
  garbage collector (foreground, background and orphan deletion);
* a pod network: Service names resolve, for the Python in pods, to the loopback port of a
  ready endpoint (``podnet/sitecustomize.py``).

Modules: :mod:`.store` (objects, selectors, patches), :mod:`.api` (HTTP), :mod:`.kubelet`
(pods as processes), :mod:`.controllers`, :mod:`.cluster` (start, stop, kubeconfig).
"""
