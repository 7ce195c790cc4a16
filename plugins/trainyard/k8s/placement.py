"""Where pods go: GPU tiers → node affinity, tolerations and priority (or Kueue labels).

A tier names an ordered list of GPU pools. Without Kueue the pods get a *required* node
affinity over every allowed pool (they never land elsewhere), a *preferred* affinity whose
weights halve down the list (the scheduler tries the first pool first), the tolerations of
those pools, and the tier's PriorityClass. With Kueue the Job is labelled for a LocalQueue
and a WorkloadPriorityClass; the ClusterQueue's flavor order does the same fallback and the
flavors inject node labels and tolerations, so the pod carries no affinity of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import V1Affinity, V1Toleration

    from trainyard.k8s.profile import ClusterProfile, Taint

# Kueue's job labels (pkg/controller/constants/constants.go, Kueue v0.19.2: QueueLabel and
# WorkloadPriorityClassLabel); the queue-name annotation is the deprecated form.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


@dataclass(frozen=True)
class Placement:
    """Scheduling fields for a pod template, and the reasons behind them.

    Attributes:
        tier: The tier name (``None`` for the CPU pool).
        node_selector: Exact node labels (CPU pool), or ``None``.
        affinity: Required + preferred node affinity, or ``None``.
        tolerations: Tolerations of the allowed pools' taints.
        priority_class_name: The PriorityClass of the pods, or ``None``.
        labels: Labels for the Job (Kueue queue and priority), empty without Kueue.
        kueue_queue: The LocalQueue name in Kueue mode (``queue_name`` of
            ``KubernetesStartKueueJobOperator``), else ``None``.
        plan: Human-readable lines: which pools, in which order, and why.
    """

    tier: str | None
    node_selector: dict[str, str] | None
    affinity: V1Affinity | None
    tolerations: list[V1Toleration]
    priority_class_name: str | None
    labels: dict[str, str] = field(default_factory=dict)
    kueue_queue: str | None = None
    plan: list[str] = field(default_factory=list)

    def pod_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``V1PodSpec`` carrying this placement."""
        return {
            "node_selector": dict(self.node_selector) if self.node_selector else None,
            "affinity": self.affinity,
            "tolerations": list(self.tolerations) or None,
            "priority_class_name": self.priority_class_name,
        }


def preference_weight(rank: int) -> int:
    """Preferred-affinity weight of the pool at ``rank`` (0 = first choice): 100, 50, 25, …, 1."""
    return max(1, 100 >> rank)


def _tolerations(taints: list[Taint]) -> list[V1Toleration]:
    from kubernetes.client import V1Toleration

    out: list[V1Toleration] = []
    seen: set[tuple[str, str | None, str]] = set()
    for t in taints:
        if (t.key, t.value, t.effect) in seen:
            continue
        seen.add((t.key, t.value, t.effect))
        if t.value is None:
            out.append(V1Toleration(key=t.key, operator="Exists", effect=t.effect))
        else:
            out.append(V1Toleration(key=t.key, operator="Equal", value=t.value, effect=t.effect))
    return out


def _taint_text(t: Taint) -> str:
    return f"{t.key}{'=' + t.value if t.value is not None else ''}:{t.effect}"


def placement_for_tier(
    profile: ClusterProfile, tier: str, *, kueue: bool | None = None
) -> Placement:
    """GPU placement of a training tier.

    Args:
        profile: The cluster profile.
        tier: Tier name (a pipeline's ``training.priority``).
        kueue: Use Kueue labels instead of affinity; defaults to ``profile.kueue.enabled``.

    Returns:
        The placement, with ``plan`` explaining it.

    Raises:
        ConfigError: If the tier is unknown.
    """
    from kubernetes.client import (
        V1Affinity,
        V1NodeAffinity,
        V1NodeSelector,
        V1NodeSelectorRequirement,
        V1NodeSelectorTerm,
        V1PreferredSchedulingTerm,
    )

    t = profile.tier(tier)
    use_kueue = profile.kueue.enabled if kueue is None else kueue
    pools = [profile.pool(name) for name in t.pools]
    plan = [f"tier {tier!r}: {t.reason or 'no reason given'}"]

    if use_kueue:
        queue = t.kueue_queue or f"trainyard-{tier}"
        wpc = t.kueue_priority_class or t.priority_class
        plan += [
            f"Kueue: LocalQueue {queue!r}, WorkloadPriorityClass {wpc!r}; the Job is created "
            "suspended and admitted as a whole when quota is free",
            "ResourceFlavors are tried in this order (the ClusterQueue's flavor list):",
            *(
                f"  {i + 1}. {p.name} ({p.description or 'generation ' + str(p.generation)})"
                for i, p in enumerate(pools)
            ),
            "node labels and tolerations come from the admitted flavor",
        ]
        return Placement(
            tier=tier,
            node_selector=None,
            affinity=None,
            tolerations=[],
            priority_class_name=t.priority_class,
            labels={KUEUE_QUEUE_LABEL: queue, KUEUE_PRIORITY_LABEL: wpc},
            kueue_queue=queue,
            plan=plan,
        )

    def exprs(labels: dict[str, str]) -> list[V1NodeSelectorRequirement]:
        return [
            V1NodeSelectorRequirement(key=k, operator="In", values=[v])
            for k, v in sorted(labels.items())
        ]

    required = V1NodeSelector(
        node_selector_terms=[
            V1NodeSelectorTerm(match_expressions=exprs(p.node_labels)) for p in pools
        ]
    )
    preferred = [
        V1PreferredSchedulingTerm(
            weight=preference_weight(i),
            preference=V1NodeSelectorTerm(match_expressions=exprs(p.node_labels)),
        )
        for i, p in enumerate(pools)
    ]
    taints = [taint for p in pools for taint in p.taints]
    tolerations = _tolerations(taints)
    plan.append(
        f"allowed pools (required node affinity): {', '.join(p.name for p in pools)}; "
        "pods never land on other nodes"
    )
    for i, p in enumerate(pools):
        role = "first choice" if i == 0 else "fallback"
        sel = ", ".join(f"{k}={v}" for k, v in sorted(p.node_labels.items()))
        desc = p.description or f"generation {p.generation}"
        plan.append(
            f"  {i + 1}. {p.name} ({desc}): {role}, weight {preference_weight(i)}; nodes {sel}"
        )
    plan.append(
        f"priority class {t.priority_class!r} (may preempt lower tiers when pools are full)"
    )
    if tolerations:
        plan.append("tolerates " + ", ".join(sorted({_taint_text(x) for x in taints})))
    plan.append(
        "on a cluster with no free allowed node, pods stay Pending until the launcher's "
        "start deadline"
    )
    return Placement(
        tier=tier,
        node_selector=None,
        affinity=V1Affinity(
            node_affinity=V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=required,
                preferred_during_scheduling_ignored_during_execution=preferred,
            )
        ),
        tolerations=tolerations,
        priority_class_name=t.priority_class,
        plan=plan,
    )


def cpu_placement(profile: ClusterProfile) -> Placement:
    """Placement on the CPU pool (step pods, parameter servers, serving).

    Args:
        profile: The cluster profile.

    Returns:
        A node selector + tolerations placement without priority class.
    """
    pool = profile.cpu_pool
    sel = ", ".join(f"{k}={v}" for k, v in sorted(pool.node_labels.items())) or "any node"
    return Placement(
        tier=None,
        node_selector=dict(pool.node_labels) or None,
        affinity=None,
        tolerations=_tolerations(list(pool.taints)),
        priority_class_name=None,
        plan=[f"CPU pool: {sel}"],
    )
