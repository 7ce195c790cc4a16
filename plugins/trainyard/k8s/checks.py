"""Offline checks: Kubernetes 1.33 schema (``kubernetes-validate``) and Pod Security "restricted".

The Pod Security check follows the Pod Security Standards (baseline + restricted, policy
version ``latest`` as of Kubernetes 1.33), applied to every container, init container and
ephemeral container of a pod or of a workload's pod template.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from trainyard.config import DNS_SUBDOMAIN_RE
from trainyard.errors import ConfigError

K8S_VERSION = "1.33.0"

RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Job": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
DNS1123_SUBDOMAIN = DNS_SUBDOMAIN_RE
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
VOLUME_SNAPSHOT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "snapshot.storage.k8s.io/v1 VolumeSnapshot",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "snapshot.storage.k8s.io/v1"},
        "kind": {"const": "VolumeSnapshot"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "maxLength": 253, "pattern": DNS1123_SUBDOMAIN.pattern},
                "namespace": {"type": "string"},
                "labels": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                        "maxLength": 63,
                        "pattern": LABEL_VALUE.pattern,
                    },
                },
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["source"],
            "additionalProperties": False,
            "properties": {
                "volumeSnapshotClassName": {"type": "string", "minLength": 1},
                "source": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "persistentVolumeClaimName": {"type": "string", "minLength": 1},
                        "volumeSnapshotContentName": {"type": "string", "minLength": 1},
                    },
                    "oneOf": [
                        {"required": ["persistentVolumeClaimName"]},
                        {"required": ["volumeSnapshotContentName"]},
                    ],
                },
            },
        },
        "status": {"type": "object"},
    },
}
"""``snapshot.storage.k8s.io/v1`` VolumeSnapshot, after the external-snapshotter CRD
(``client/config/crd/snapshot.storage.k8s.io_volumesnapshots.yaml``): ``spec.source`` is
required and names exactly one of a PVC or a VolumeSnapshotContent; the class name, when
given, is not empty. Unknown fields are errors (the API server would drop them), as in
the strict check of core kinds."""


def to_dict(obj: Any) -> dict[str, Any]:
    """The API (camelCase) form of a typed ``kubernetes.client`` object or a dict.

    Args:
        obj: A model object or an already-serialised dict.

    Returns:
        A new plain dict without ``None`` fields.
    """
    if isinstance(obj, dict):
        return copy.deepcopy(obj)
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _get(d: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _sc_violations(where: str, sc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{where}: windowsOptions.hostProcess must not be true")
    se = sc.get("seLinuxOptions") or {}
    if se.get("type", "") not in SELINUX_TYPES:
        out.append(f"{where}: seLinuxOptions.type {se.get('type')!r} is not allowed")
    for key in ("user", "role"):
        if se.get(key):
            out.append(f"{where}: seLinuxOptions.{key} must not be set")
    app = sc.get("appArmorProfile") or {}
    if app and app.get("type") not in ("RuntimeDefault", "Localhost"):
        out.append(f"{where}: appArmorProfile.type must be RuntimeDefault or Localhost")
    if sc.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser must not be 0")
    return out


def pss_violations(pod_spec: dict[str, Any], where: str = "spec") -> list[str]:
    """Pod Security Standards "restricted" violations of a pod spec (API dict form).

    Args:
        pod_spec: ``spec`` of a Pod (or of a pod template).
        where: Prefix for messages (e.g. ``Job/x spec.template.spec``).

    Returns:
        One message per violation; empty when the pod is admitted by a namespace with
        ``pod-security.kubernetes.io/enforce: restricted``.
    """
    out: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            out.append(f"{where}.{field}: host namespaces are forbidden")
    psc = pod_spec.get("securityContext") or {}
    out += _sc_violations(f"{where}.securityContext", psc)
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(
                f"{where}.securityContext.sysctls: {sysctl.get('name')!r} is not a safe sysctl"
            )
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(
            f"{where}.securityContext.seccompProfile.type must be RuntimeDefault or Localhost"
        )
    pod_non_root = psc.get("runAsNonRoot")
    if pod_non_root is False:
        out.append(f"{where}.securityContext.runAsNonRoot must not be false")

    for i, vol in enumerate(pod_spec.get("volumes") or []):
        kinds = [k for k in vol if k != "name"]
        bad = [k for k in kinds if k not in RESTRICTED_VOLUME_TYPES]
        if bad:
            out.append(
                f"{where}.volumes[{i}] ({vol.get('name')}): volume type {bad[0]} is not allowed "
                f"(restricted allows {', '.join(sorted(RESTRICTED_VOLUME_TYPES))})"
            )

    containers = [
        (kind, c)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for c in pod_spec.get(kind) or []
    ]
    for kind, c in containers:
        cw = f"{where}.{kind}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        out += _sc_violations(f"{cw}.securityContext", sc)
        if sc.get("privileged"):
            out.append(f"{cw}: privileged containers are forbidden")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{cw}: securityContext.allowPrivilegeEscalation must be false")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{cw}: securityContext.procMount must be Default")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{cw}: securityContext.capabilities.drop must include ALL")
        extra = [cap for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
        if extra:
            out.append(f"{cw}: capabilities.add may only contain NET_BIND_SERVICE, got {extra}")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod_non_root is not True):
            out.append(f"{cw}: runAsNonRoot must be true (on the container or the pod)")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is None and pod_seccomp is None:
            out.append(f"{cw}: seccompProfile.type must be RuntimeDefault or Localhost")
        elif seccomp not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"{cw}: seccompProfile.type {seccomp!r} is not allowed")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{cw}: hostPort {port['hostPort']} is forbidden")
    return out


def _kind_name(data: dict[str, Any]) -> str:
    return f"{data.get('kind', '?')}/{_get(data, ('metadata', 'name')) or '?'}"


def schema_errors(data: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Errors of an object's dict form against a JSON schema, one line each.

    Args:
        data: The object (API dict form).
        schema: A JSON schema (draft 2020-12), e.g. :data:`VOLUME_SNAPSHOT_SCHEMA`.

    Returns:
        ``Kind/name: field.path: message`` per error, in path order; empty when valid.
    """
    import jsonschema

    where = _kind_name(data)
    out = []
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.path]):
        path = ".".join(str(p) for p in e.path) or "<root>"
        message = e.message
        if e.validator == "oneOf":
            choices = [" + ".join(s.get("required", [])) for s in e.validator_value]
            message = f"set exactly one of {', '.join(choices)}"
        out.append(f"{where}: {path}: {message}")
    return out


def _structural(data: dict[str, Any]) -> list[str] | None:
    """Checks for the CRDs we render (Kueue, VolumeSnapshot); None if the kind is unknown."""
    api, kind = data.get("apiVersion", ""), data.get("kind", "")
    if api == "snapshot.storage.k8s.io/v1" and kind == "VolumeSnapshot":
        return schema_errors(data, VOLUME_SNAPSHOT_SCHEMA)
    spec = data.get("spec") or {}
    where = _kind_name(data)
    errors: list[str] = []
    name = _get(data, ("metadata", "name")) or ""
    if not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        errors.append(f"{where}: metadata.name {name!r} is not a DNS-1123 subdomain")
    if api == "kueue.x-k8s.io/v1beta1" or api == "kueue.x-k8s.io/v1beta2":
        if kind == "ResourceFlavor":
            if not isinstance(spec.get("nodeLabels", {}), dict):
                errors.append(f"{where}: spec.nodeLabels must be a mapping")
            for t in spec.get("tolerations") or []:
                if "key" not in t and t.get("operator") != "Exists":
                    errors.append(f"{where}: toleration without key must use operator Exists")
        elif kind == "ClusterQueue":
            groups = spec.get("resourceGroups")
            if not isinstance(groups, list) or not groups:
                errors.append(f"{where}: spec.resourceGroups must be a non-empty list")
            for gi, g in enumerate(groups or []):
                covered = g.get("coveredResources") or []
                flavors = g.get("flavors") or []
                if not covered or not flavors:
                    errors.append(
                        f"{where}: resourceGroups[{gi}] needs coveredResources and flavors"
                    )
                for f in flavors:
                    names = [r.get("name") for r in f.get("resources") or []]
                    if names != covered:
                        errors.append(
                            f"{where}: resourceGroups[{gi}] flavor {f.get('name')}: resources "
                            f"{names} must list coveredResources {covered} in order"
                        )
                    for r in f.get("resources") or []:
                        if "nominalQuota" not in r:
                            errors.append(
                                f"{where}: flavor {f.get('name')} {r.get('name')}: "
                                "nominalQuota missing"
                            )
        elif kind == "LocalQueue":
            if not _get(data, ("metadata", "namespace")):
                errors.append(f"{where}: a LocalQueue is namespaced (metadata.namespace)")
            if not spec.get("clusterQueue"):
                errors.append(f"{where}: spec.clusterQueue is required")
        elif kind == "WorkloadPriorityClass":
            if not isinstance(data.get("value"), int):
                errors.append(f"{where}: value must be an integer")
        else:
            return None
        return errors
    return None


def validate_object(obj: Any, version: str = K8S_VERSION) -> list[str]:
    """Validate one object: the Kubernetes JSON schema (strict) and Pod Security "restricted".

    Core kinds are checked with ``kubernetes-validate`` against ``version``; the CRDs we
    render get structural checks (Kueue objects; VolumeSnapshot against
    :data:`VOLUME_SNAPSHOT_SCHEMA`); pods and workloads also get :func:`pss_violations`.

    Args:
        obj: A typed object or its dict form.
        version: Kubernetes version of the schema.

    Returns:
        Error messages naming kind/name and field; empty when valid.
    """
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    data = to_dict(obj)
    where = _kind_name(data)
    if "apiVersion" not in data or "kind" not in data:
        return [f"{where}: apiVersion and kind are required"]
    errors: list[str] = []
    try:
        kubernetes_validate.validate(data, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "<root>"
        errors.append(f"{where}: {path}: {e.message}")
    except SchemaNotFoundError:
        structural = _structural(data)
        if structural is None:
            errors.append(f"{where}: no schema for {data['apiVersion']} {data['kind']}")
        else:
            errors += structural
    path = POD_TEMPLATE_PATHS.get(data["kind"])
    if path is not None:
        spec = _get(data, path)
        if isinstance(spec, dict):
            errors += pss_violations(spec, f"{where} {'.'.join(path)}")
    return errors


def render_yaml(objs: list[Any]) -> str:
    """Objects as one multi-document YAML string (``kubectl apply -f -`` ready).

    Args:
        objs: Typed objects or dicts.

    Returns:
        Documents separated by ``---``, keys in API order.
    """
    docs = [to_dict(o) for o in objs]
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)


def load_manifests(text: str, source: str) -> list[dict[str, Any]]:
    """Parse a multi-document manifest (empty documents skipped).

    Args:
        text: YAML text.
        source: File name for errors.

    Returns:
        The documents.

    Raises:
        ConfigError: If the text is not YAML or a document is not a mapping.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from e
    for i, d in enumerate(docs):
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: document {i} is not a mapping")
    return docs
