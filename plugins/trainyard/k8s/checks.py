"""Offline checks: Kubernetes 1.33 schema (``kubernetes-validate``) and Pod Security "restricted".

Kueue objects (``kueue.x-k8s.io``) are checked against ``deploy/k8s/schemas/kueue-v1beta2.json``,
a JSON schema of the Kueue v1beta2 kinds written from Kueue's v1beta2 Go types and CRDs
(the file cites the Kueue release), plus the cross-field rules of Kueue's admission webhook.

The Pod Security check follows the Pod Security Standards (baseline + restricted, policy
version ``latest`` as of Kubernetes 1.33), applied to every container, init container and
ephemeral container of a pod or of a workload's pod template.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from trainyard.config import DNS_SUBDOMAIN_RE, label_key_problem, label_value_problem
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


KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/v1beta2"
KUEUE_SCHEMA_PATH = (
    Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "schemas" / "kueue-v1beta2.json"
)
"""Our JSON schema of the Kueue v1beta2 kinds (one ``$defs`` entry per kind); its
``$comment`` names the Kueue release and the source files it was written from."""
KUEUE_RENAMED_FIELDS: dict[tuple[str, str], str] = {
    ("ClusterQueue", "cohort"): "spec.cohortName",
    ("ClusterQueue", "admissionChecks"): "spec.admissionChecksStrategy.admissionChecks",
}
"""v1beta1 ``spec`` fields of a kind that v1beta2 renamed or moved: (kind, field) -> new path."""


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
        ``Kind/name: field.path: message`` per error, in path order; empty when valid. A
        failing subschema's ``x-message`` (not a JSON Schema keyword) replaces the
        validator's message.
    """
    import jsonschema

    where = _kind_name(data)
    out = []
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.path]):
        path = ".".join(str(p) for p in e.path) or "<root>"
        message = e.message
        if isinstance(e.schema, dict) and "x-message" in e.schema:
            message = f"{e.instance!r}: {e.schema['x-message']}"
        elif e.validator == "oneOf":
            choices = [" + ".join(s.get("required", [])) for s in e.validator_value]
            message = f"set exactly one of {', '.join(choices)}"
        out.append(f"{where}: {path}: {message}")
    return out


@functools.cache
def kueue_schema(path: Path = KUEUE_SCHEMA_PATH) -> dict[str, Any]:
    """Our JSON schema of the Kueue v1beta2 kinds (read once).

    Args:
        path: The schema file; default :data:`KUEUE_SCHEMA_PATH`.

    Returns:
        The schema; ``schema["$defs"][kind]`` is a kind's object schema.

    Raises:
        ConfigError: If the file is missing or not JSON.
    """
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the Kueue v1beta2 schema: {e}") from e


def _quantity(value: int | str) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity

    return parse_quantity(value)


def _kueue_quota_errors(data: dict[str, Any], where: str) -> list[str]:
    """Cross-field rules of Kueue's webhook (``pkg/webhooks/clusterqueue_webhook.go``).

    Resource names of each flavor match ``coveredResources`` in order; a resource and a
    flavor belong to one resource group only; borrowing and lending limits need a cohort
    (ClusterQueue ``cohortName``, Cohort ``parentName``); a lending limit is at most the
    nominal quota. Only called on objects that passed the schema (types are right).
    """
    kind = data["kind"]
    spec = data.get("spec") or {}
    errors: list[str] = []
    groups = spec.get("resourceGroups") or []
    if kind == "ClusterQueue" and not groups:
        errors.append(
            f"{where}: spec.resourceGroups must be a non-empty list "
            "(a ClusterQueue without quota admits nothing)"
        )
    parent = "cohortName" if kind == "ClusterQueue" else "parentName"
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    for gi, group in enumerate(groups):
        gpath = f"spec.resourceGroups.{gi}"
        covered = group["coveredResources"]
        for r in covered:
            if r in seen_resources:
                errors.append(f"{where}: {gpath}.coveredResources: {r!r} is in two groups")
            seen_resources.add(r)
        for fi, flavor in enumerate(group["flavors"]):
            fpath = f"{gpath}.flavors.{fi}"
            if flavor["name"] in seen_flavors:
                errors.append(f"{where}: {fpath}.name: flavor {flavor['name']!r} is listed twice")
            seen_flavors.add(flavor["name"])
            names = [r["name"] for r in flavor["resources"]]
            if names != covered:
                errors.append(
                    f"{where}: {fpath}: flavor {flavor['name']}: resources {names} must list "
                    f"coveredResources {covered} in order"
                )
            for ri, quota in enumerate(flavor["resources"]):
                for limit in ("borrowingLimit", "lendingLimit"):
                    if limit in quota and not spec.get(parent):
                        errors.append(
                            f"{where}: {fpath}.resources.{ri}.{limit}: needs spec.{parent}"
                        )
                if "lendingLimit" in quota and _quantity(quota["lendingLimit"]) > _quantity(
                    quota["nominalQuota"]
                ):
                    errors.append(
                        f"{where}: {fpath}.resources.{ri}.lendingLimit: must be at most "
                        "nominalQuota"
                    )
    return errors


def _kueue_flavor_errors(data: dict[str, Any], where: str) -> list[str]:
    """Label syntax rules of Kueue's webhook (``pkg/webhooks/resourceflavor_webhook.go``).

    ``spec.nodeLabels`` are node labels (``ValidateLabels``: qualified-name keys, label
    values) and ``spec.nodeTaints`` node taints (the same key and value syntax): a flavor
    whose labels no node can carry would admit workloads that never schedule. Only called
    on objects that passed the schema (types are right).
    """
    spec = data.get("spec") or {}
    errors = [
        f"{where}: spec.nodeLabels.{key}: {problem}"
        for key, value in (spec.get("nodeLabels") or {}).items()
        if (problem := label_key_problem(key) or label_value_problem(value))
    ]
    for i, taint in enumerate(spec.get("nodeTaints") or []):
        problem = label_key_problem(taint["key"]) or label_value_problem(taint.get("value", ""))
        if problem:
            errors.append(f"{where}: spec.nodeTaints.{i}: {problem}")
    return errors


def kueue_errors(data: dict[str, Any], schema_path: Path = KUEUE_SCHEMA_PATH) -> list[str]:
    """Errors of a Kueue object against our v1beta2 schema and Kueue's webhook rules.

    Only ``kueue.x-k8s.io/v1beta2`` is accepted: v1beta1 is deprecated since Kueue v0.16
    (where v1beta2 became the storage version) and is not what Kueue's docs and webhooks
    are written for; v1beta1 fields that v1beta2 renamed (ClusterQueue ``spec.cohort``)
    get a hint naming the new field.

    Args:
        data: The object (API dict form) with a ``kueue.x-k8s.io/...`` apiVersion.
        schema_path: The schema file; default :data:`KUEUE_SCHEMA_PATH`.

    Returns:
        ``Kind/name: field.path: message`` per error; empty when valid.
    """
    where = _kind_name(data)
    api, kind = data.get("apiVersion"), data.get("kind")
    if api != KUEUE_API_VERSION:
        return [
            f"{where}: apiVersion {api!r} is not supported: use {KUEUE_API_VERSION} "
            "(Kueue's storage version since v0.16, which deprecated v1beta1)"
        ]
    schema = kueue_schema(schema_path)
    defs = schema["$defs"]
    if not isinstance(kind, str) or not kind[:1].isupper() or kind not in defs:
        known = ", ".join(sorted(k for k in defs if k[:1].isupper()))
        return [f"{where}: no schema for {api} {kind} (known kinds: {known})"]
    errors = [
        f"{where}: spec.{field}: not a v1beta2 field; v1beta2 calls it {new}"
        for (k, field), new in KUEUE_RENAMED_FIELDS.items()
        if k == kind and field in (data.get("spec") or {})
    ]
    errors += schema_errors(
        data, {"$schema": schema["$schema"], "$defs": defs, "$ref": f"#/$defs/{kind}"}
    )
    if not errors and kind in ("ClusterQueue", "Cohort"):
        errors += _kueue_quota_errors(data, where)
    if not errors and kind == "ResourceFlavor":
        errors += _kueue_flavor_errors(data, where)
    return errors


def validate_object(obj: Any, version: str = K8S_VERSION) -> list[str]:
    """Validate one object: the Kubernetes JSON schema (strict) and Pod Security "restricted".

    Core kinds are checked with ``kubernetes-validate`` against ``version``; of the CRDs,
    Kueue objects go to :func:`kueue_errors` (our v1beta2 schema; any other Kueue version
    is an error) and VolumeSnapshot is checked against :data:`VOLUME_SNAPSHOT_SCHEMA`;
    pods and workloads also get :func:`pss_violations`.

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
    if str(data["apiVersion"]).split("/")[0] == KUEUE_GROUP:
        return kueue_errors(data)
    errors: list[str] = []
    try:
        kubernetes_validate.validate(data, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "<root>"
        errors.append(f"{where}: {path}: {e.message}")
    except SchemaNotFoundError:
        if data["apiVersion"] == "snapshot.storage.k8s.io/v1" and data["kind"] == "VolumeSnapshot":
            errors += schema_errors(data, VOLUME_SNAPSHOT_SCHEMA)
        else:
            errors.append(f"{where}: no schema for {data['apiVersion']} {data['kind']}")
    template = POD_TEMPLATE_PATHS.get(data["kind"])
    if template is not None:
        spec = _get(data, template)
        if isinstance(spec, dict):
            errors += pss_violations(spec, f"{where} {'.'.join(template)}")
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
