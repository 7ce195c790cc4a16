"""The cluster's own manifests (``deploy/k8s/*.yaml``) checked against the cluster profile.

What a platform team applies once (namespace, RBAC, PriorityClasses, Kueue queues) is
written by hand; trainyard's rendered objects name it through the profile. So one command
checks both sides before anything is applied: ``python -m trainyard check-manifests``
validates every object (:func:`trainyard.k8s.checks.validate_object`: the Kubernetes
schema, Pod Security "restricted", Kueue's v1beta2 schema) and :func:`profile_errors`
checks that what the profile names exists and agrees.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainyard.errors import ConfigError
from trainyard.k8s.profile import ClusterProfile, Taint

PSS_MODES = ("enforce", "audit", "warn")


def _named(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {str(d.get("metadata", {}).get("name")): d for d in docs if d.get("kind") == kind}


def _tolerations(taints: Iterable[Taint]) -> list[tuple[str, str | None, str]]:
    return [(t.key, t.value, t.effect) for t in taints]


def _kueue_errors(docs: list[dict[str, Any]], profile: ClusterProfile) -> list[str]:
    errors: list[str] = []
    flavors = _named(docs, "ResourceFlavor")
    for pool in profile.gpu_pools:
        flavor = flavors.get(pool.name)
        if flavor is None:
            errors.append(f"ResourceFlavor {pool.name}: missing (GPU pool {pool.name})")
            continue
        spec = flavor.get("spec") or {}
        if (spec.get("nodeLabels") or {}) != pool.node_labels:
            errors.append(
                f"ResourceFlavor {pool.name}: nodeLabels {spec.get('nodeLabels')} are not the "
                f"pool's node_labels {pool.node_labels}"
            )
        got = [
            (t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("tolerations") or ()
        ]
        if got != _tolerations(pool.taints):
            errors.append(
                f"ResourceFlavor {pool.name}: tolerations {got} are not the pool's taints "
                f"{_tolerations(pool.taints)}"
            )
    local_queues = _named(docs, "LocalQueue")
    cluster_queues = _named(docs, "ClusterQueue")
    priorities = _named(docs, "WorkloadPriorityClass")
    for name, tier in profile.tiers.items():
        queue = tier.kueue_queue
        if queue is None:
            errors.append(f"tier {name}: no kueue_queue in the profile (kueue.enabled is true)")
            continue
        lq = local_queues.get(queue)
        if lq is None:
            errors.append(f"LocalQueue {queue}: missing (tier {name}'s kueue_queue)")
            continue
        if lq.get("metadata", {}).get("namespace") != profile.namespace:
            errors.append(
                f"LocalQueue {queue}: namespace {lq.get('metadata', {}).get('namespace')!r} "
                f"is not the profile's {profile.namespace!r}"
            )
        target = (lq.get("spec") or {}).get("clusterQueue")
        cq = cluster_queues.get(str(target))
        if cq is None:
            errors.append(f"LocalQueue {queue}: its ClusterQueue {target!r} is missing")
        else:
            groups = (cq.get("spec") or {}).get("resourceGroups") or ()
            order = [f.get("name") for g in groups for f in g.get("flavors") or ()]
            if order != list(tier.pools):
                errors.append(
                    f"ClusterQueue {target}: flavors {order} are not tier {name}'s pools in "
                    f"order {list(tier.pools)} (Kueue tries flavors in that order)"
                )
        wpc = tier.kueue_priority_class or tier.priority_class
        if wpc not in priorities:
            errors.append(f"WorkloadPriorityClass {wpc}: missing (tier {name})")
    return errors


def profile_errors(docs: list[dict[str, Any]], profile: ClusterProfile) -> list[str]:
    """What the profile names that the manifests lack or contradict.

    The namespace (with Pod Security "restricted" enforced), the service account, a
    PriorityClass per tier (a higher tier above a lower one is not assumed: values are the
    team's), and, with ``kueue.enabled`` or any Kueue object among ``docs``, a
    ResourceFlavor per GPU pool with its node labels and taints, a LocalQueue per tier in
    the namespace whose ClusterQueue lists the tier's pools in order, and a
    WorkloadPriorityClass per tier.

    Args:
        docs: Every object of the manifests, as dicts.
        profile: The cluster profile.

    Returns:
        One message per disagreement, naming the object and the profile's field.
    """
    errors: list[str] = []
    namespace = _named(docs, "Namespace").get(profile.namespace)
    if namespace is None:
        errors.append(f"Namespace {profile.namespace}: missing (the profile's namespace)")
    else:
        labels = namespace.get("metadata", {}).get("labels") or {}
        for mode in PSS_MODES:
            if labels.get(f"pod-security.kubernetes.io/{mode}") != "restricted":
                errors.append(
                    f"Namespace {profile.namespace}: label pod-security.kubernetes.io/{mode} "
                    "is not 'restricted' (trainyard's pods are built for it)"
                )
    accounts = {
        str(d.get("metadata", {}).get("name"))
        for d in docs
        if d.get("kind") == "ServiceAccount"
        and d.get("metadata", {}).get("namespace") == profile.namespace
    }
    if profile.service_account not in accounts:
        errors.append(
            f"ServiceAccount {profile.namespace}/{profile.service_account}: missing (the "
            "profile's service_account)"
        )
    classes = _named(docs, "PriorityClass")
    for name, tier in profile.tiers.items():
        if tier.priority_class not in classes:
            errors.append(f"PriorityClass {tier.priority_class}: missing (tier {name})")
    kueue_docs = any(str(d.get("apiVersion", "")).startswith("kueue.x-k8s.io/") for d in docs)
    if profile.kueue.enabled or kueue_docs:
        errors += _kueue_errors(docs, profile)
    return errors


def manifest_files(paths: Iterable[Path]) -> list[Path]:
    """The YAML files named, a folder standing for its ``*.yaml`` and ``*.yml`` files.

    Raises:
        ConfigError: If a path does not exist or a folder holds no YAML file.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                raise ConfigError(f"{path}: no *.yaml or *.yml file in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{path}: no such file or folder")
    return files


def check(files: list[Path], profile: ClusterProfile) -> tuple[int, list[str]]:
    """Validate every object of ``files`` and check them against ``profile``.

    Returns:
        How many objects were read, and every error (``file: Kind/name: ...`` for an
        object's own, ``profile: ...`` for a disagreement with the profile).

    Raises:
        ConfigError: If a file is not YAML or a document is not a mapping.
    """
    from trainyard.k8s.checks import load_manifests, validate_object

    docs: list[dict[str, Any]] = []
    errors: list[str] = []
    for path in files:
        for doc in load_manifests(path.read_text(encoding="utf-8"), str(path)):
            docs.append(doc)
            errors += [f"{path}: {e}" for e in validate_object(doc)]
    errors += [f"profile: {e}" for e in profile_errors(docs, profile)]
    return len(docs), errors


def cli_main(argv: list[str]) -> int:
    """``python -m trainyard check-manifests [--profile P] [PATH ...]``.

    Args:
        argv: Arguments after ``check-manifests``.

    Returns:
        0 when every object is valid and agrees with the profile, 3 otherwise (each
        error printed on a line of its own).
    """
    from trainyard import argtypes
    from trainyard.k8s.profile import load_cluster_profile
    from trainyard.settings import get_settings

    parser = argtypes.ArgumentParser(
        prog="python -m trainyard check-manifests",
        description="Check the cluster's manifests against the Kubernetes 1.33 schema, Pod "
        "Security 'restricted', Kueue v1beta2 and the cluster profile.",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="manifest files or folders (default: deploy/k8s of the checkout)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="cluster profile YAML (default: TRAINYARD_CLUSTER_PROFILE or "
        "deploy/cluster_profile.yaml)",
    )
    args = parser.parse_args(argv)
    settings = get_settings()
    profile_path = args.profile or settings.cluster_profile
    profile = load_cluster_profile(profile_path)
    files = manifest_files(args.paths or [settings.project_dir / "deploy" / "k8s"])
    count, errors = check(files, profile)
    for line in errors:
        sys.stdout.write(line + "\n")
    if errors:
        sys.stderr.write(
            f"check-manifests: {len(errors)} error(s) in {count} object(s) of {len(files)} "
            f"file(s), against {profile_path}\n"
        )
        return 3
    sys.stdout.write(
        f"ok: {count} object(s) in {len(files)} file(s) are valid and agree with {profile_path}\n"
    )
    return 0
