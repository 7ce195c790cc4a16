"""The declarative promotion gate: a pure function of config and metrics.

``decide`` takes the gate config, the candidate's and the champion's metrics, the
lineage's (every version served before, scored on the same holdout) and an optional
force request, and returns a ``GateDecision`` that lists every check and renders as
markdown (``gate.md``) and JSON (``gate.json``). A gate that cannot decide (a missing
metric, NaN) rejects, and says why.

The champion rule alone would be a ratchet: each candidate may be ``max_regression``
worse than the one before, and those steps add up. So a candidate is also compared with
each version served before, on the same holdout: over any sequence of runs the served
model stays within ``max_regression`` of the best version ever served (``lineage:vN``
checks).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trainyard.config import (
    DEFAULT_GATE_METRICS,
    GateConfig,
    Threshold,
)
from trainyard.errors import GateRejected

log = logging.getLogger("trainyard.evaluation")

_TOL = 1e-9  # float slack when comparing a metric with a bound


def gate_metrics(gate: GateConfig) -> list[str]:
    """The metrics a gate reports: its own, else a classifier's defaults.

    ``evaluate_and_decide`` fills in the defaults of the contract's task first
    (``GateConfig.for_task``).
    """
    return list(
        gate.metrics if gate.metrics is not None else DEFAULT_GATE_METRICS["classification"]
    )


def required_metrics(gate: GateConfig) -> list[str]:
    """The base metrics a gate reads: its ``metrics``, thresholds and champion rule.

    A gate whose ``metrics`` were not given (see ``GateConfig.for_task``) reads a
    classifier's defaults.
    """
    names = gate_metrics(gate)
    names += [k.split("@", 1)[0] for k in gate.thresholds]
    if gate.champion:
        names.append(gate.champion.metric.split("@", 1)[0])
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class ForceRequest:
    """A person's request to promote whatever the gate says (the ``force_promote`` param).

    Attributes:
        actor: Who asked.
        reason: Why (required, non-empty).
        at: When (ISO timestamp).
    """

    actor: str
    reason: str
    at: str

    def __post_init__(self) -> None:
        if not str(self.reason or "").strip():
            raise GateRejected("force_promote needs a non-empty reason (force_reason)")
        if not str(self.actor or "").strip():
            raise GateRejected("force_promote needs the actor who asked for it")
        if isinstance(self.at, dt.datetime):
            object.__setattr__(self, "at", self.at.isoformat())


@dataclass(frozen=True)
class Check:
    """One line of the gate report."""

    name: str
    metric: str
    candidate: float | None
    champion: float | None
    threshold: str
    passed: bool
    note: str = ""


Verdict = Literal["promote", "reject", "forced", "keep"]
"""``keep``: the candidate is the champion itself (a run that reused the version trained
on its inputs): it keeps serving, nothing is deployed."""


@dataclass(frozen=True)
class LineageScore:
    """A version served before, scored on the candidate's holdout.

    Attributes:
        version: The version.
        metrics: Its metrics on that holdout (empty when ``error``).
        error: Why it could not be scored (the gate cannot decide: it rejects).
    """

    version: int
    metrics: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


@dataclass(frozen=True)
class GateDecision:
    """The gate's verdict with every check behind it.

    Attributes:
        promote: Whether the candidate may be deployed and made champion.
        verdict: ``promote``, ``reject`` or ``forced`` (promoted over failed checks).
        reason: One readable sentence.
        checks: Every check, in order.
        first_run: There was no champion, so only thresholds were checked.
        force: The force request, if any.
        candidate_metrics: The candidate's metrics.
        champion_metrics: The champion's metrics (None on the first run).
        version: The candidate version (set by ``evaluate_and_decide``).
        champion_version: The champion version it was compared with.
        smoke: ``{"keys": [...], "class_ids": [...]}``: the candidate's predictions for the
            first holdout rows, for the deploy smoke test.
        fail_run_on_reject: The pipeline wants a rejection to fail the run.
        timings: Seconds spent evaluating (``candidate_seconds``, ``champion_seconds``,
            ``lineage_seconds``) and how many scores came from the cache (``cached``).
        diagnostics: The candidate's confusion matrix or residuals (:func:`diagnostics`).
        lineage: The versions served before, each with the compared metric's value on
            this holdout (``version``, ``value``, ``error``).
    """

    promote: bool
    verdict: Verdict
    reason: str
    checks: list[Check]
    first_run: bool
    force: ForceRequest | None = None
    candidate_metrics: dict[str, float] = field(default_factory=dict)
    champion_metrics: dict[str, float] | None = None
    version: int | None = None
    champion_version: int | None = None
    smoke: dict[str, list[Any]] | None = None
    fail_run_on_reject: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, Any] | None = None
    lineage: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``gate.json``); non-finite numbers become null."""
        return _clean(
            {
                "promote": self.promote,
                "verdict": self.verdict,
                "reason": self.reason,
                "first_run": self.first_run,
                "checks": [dataclasses.asdict(c) for c in self.checks],
                "force": dataclasses.asdict(self.force) if self.force else None,
                "candidate_metrics": self.candidate_metrics,
                "champion_metrics": self.champion_metrics,
                "version": self.version,
                "champion_version": self.champion_version,
                "smoke": self.smoke,
                "fail_run_on_reject": self.fail_run_on_reject,
                "timings": self.timings,
                "diagnostics": self.diagnostics,
                "lineage": self.lineage,
            }
        )

    def to_json(self) -> str:
        """``gate.json`` content."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    def to_markdown(self) -> str:
        """``gate.md``: the verdict, its reason and a table of every check."""
        who = f"version {self.version}" if self.version is not None else "candidate"
        if self.champion_version is not None:
            against = f"champion version {self.champion_version}"
        else:
            against = "no champion" if self.champion_metrics is None else "the champion"
        lines = [
            f"## Gate: {self.verdict.upper()} ({who} vs {against})",
            "",
            f"**Verdict:** {self.verdict}. {self.reason}",
            "",
        ]
        if self.first_run and not self.lineage:
            lines += ["First run: there is no champion yet, so only absolute thresholds apply.", ""]
        if self.verdict == "keep":
            lines += [
                "This version is the champion: it keeps serving and nothing is deployed. The "
                "checks below are today's, on this run's holdout.",
                "",
            ]
        if self.lineage:
            served = ", ".join(
                f"v{e['version']} {_fmt(e.get('value'))}"
                if not e.get("error")
                else f"v{e['version']} (not scored)"
                for e in self.lineage
            )
            lines += [f"Served before, scored on this holdout: {served}.", ""]
        if self.force:
            lines += [
                f"Force promote requested by **{self.force.actor}** at {self.force.at}: "
                f"{self.force.reason}",
                "",
            ]
        lines += [
            "| check | metric | candidate | compared with | threshold | result | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in self.checks:
            cells = [
                c.name,
                c.metric,
                _fmt(c.candidate),
                _fmt(c.champion),
                c.threshold,
                "pass" if c.passed else "**FAIL**",
                c.note,
            ]
            lines.append("| " + " | ".join(s.replace("|", "\\|") for s in cells) + " |")
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, Any]:
        """What the evaluate step returns (XCom): verdict, reason, metrics, the report."""
        return _clean(
            {
                "promote": self.promote,
                "verdict": self.verdict,
                "reason": self.reason,
                "first_run": self.first_run,
                "version": self.version,
                "champion": self.champion_version,
                "metrics": self.candidate_metrics,
                "champion_metrics": self.champion_metrics,
                "forced_by": self.force.actor if self.force and self.verdict == "forced" else None,
                "fail_run_on_reject": self.fail_run_on_reject,
                "report": self.to_markdown(),
            }
        )

    def report_files(self) -> dict[str, bytes]:
        """``gate.md`` and ``gate.json`` as bytes, ready for ``Registry.attach``."""
        return {"gate.md": self.to_markdown().encode(), "gate.json": self.to_json().encode()}


def _bound_text(th: Threshold) -> str:
    parts = []
    if th.min is not None:
        parts.append(f">= {th.min:g}")
    if th.max is not None:
        parts.append(f"<= {th.max:g}")
    return " and ".join(parts) or "any"


def _threshold_check(
    name: str,
    metric: str,
    th: Threshold,
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
) -> Check:
    raw = candidate.get(metric)
    value = _finite(raw)
    champ = _finite((champion or {}).get(metric))
    if value is None:
        note = "missing" if raw is None else f"not a finite number ({raw!r})"
        return Check(name, metric, None, champ, _bound_text(th), False, note)
    low_ok = th.min is None or value >= th.min - _TOL
    high_ok = th.max is None or value <= th.max + _TOL
    note = "" if low_ok and high_ok else ("below minimum" if not low_ok else "above maximum")
    return Check(name, metric, value, champ, _bound_text(th), low_ok and high_ok, note)


def _champion_check(
    gate: GateConfig, candidate: Mapping[str, Any], champion: Mapping[str, Any]
) -> Check:
    assert gate.champion is not None
    rule = gate.champion
    metric = rule.metric
    cand, champ = _finite(candidate.get(metric)), _finite(champion.get(metric))
    name = f"champion:{metric}"
    if cand is None or champ is None:
        whose = "candidate" if cand is None else "champion"
        return Check(name, metric, cand, champ, "-", False, f"{whose} value missing or not finite")
    required = rule.min_improvement if rule.min_improvement > 0 else -rule.max_regression
    scale = abs(champ) if rule.relative else 1.0
    sign = 1.0 if rule.higher_is_better else -1.0
    bound = champ + sign * required * scale
    op = ">=" if rule.higher_is_better else "<="
    passed = (cand >= bound - _TOL) if rule.higher_is_better else (cand <= bound + _TOL)
    unit = f"{required:+.2%} of champion" if rule.relative else f"{required:+g}"
    kind = (
        "improvement" if required > 0 else ("tolerated regression" if required < 0 else "no worse")
    )
    threshold = f"{op} {bound:.4f} (champion {unit}, {kind})"
    delta = (cand - champ) * sign
    trend = "improves" if delta > 0 else "regresses" if delta < 0 else "equals"
    note = "equals the champion" if delta == 0 else f"{trend} by {abs(cand - champ):.4f}"
    return Check(name, metric, cand, champ, threshold, passed, note)


def _lineage_checks(
    gate: GateConfig, candidate: Mapping[str, Any], lineage: Sequence[LineageScore]
) -> list[Check]:
    """The candidate against every version served before, on the same holdout.

    Each may be beaten by at most ``max_regression`` (of its value when ``relative``):
    the champion rule's tolerance for one step, never more below the best served.
    """
    assert gate.champion is not None
    rule = gate.champion
    metric = rule.metric
    cand = _finite(candidate.get(metric))
    sign = 1.0 if rule.higher_is_better else -1.0
    scored = [(e, _finite(e.metrics.get(metric))) for e in lineage if e.error is None]
    values = [v for _, v in scored if v is not None]
    best = (max if rule.higher_is_better else min)(values) if values else None
    op = ">=" if rule.higher_is_better else "<="
    checks = []
    for entry in sorted(lineage, key=lambda e: e.version):
        name = f"lineage:v{entry.version}"
        if entry.error is not None:
            checks.append(Check(name, metric, cand, None, "-", False, entry.error))
            continue
        value = _finite(entry.metrics.get(metric))
        if cand is None or value is None:
            whose = "candidate" if cand is None else f"version {entry.version}"
            note = f"{whose}'s value missing or not finite"
            checks.append(Check(name, metric, cand, value, "-", False, note))
            continue
        tolerance = rule.max_regression * (abs(value) if rule.relative else 1.0)
        bound = value - sign * tolerance
        passed = (cand >= bound - _TOL) if rule.higher_is_better else (cand <= bound + _TOL)
        delta = (cand - value) * sign
        trend = "improves on" if delta > 0 else "regresses from" if delta < 0 else "equals"
        note = f"{trend} version {entry.version}, served before"
        if delta:
            note = f"{trend} version {entry.version} by {abs(cand - value):.4f}, served before"
        if value == best:
            note += " (the best served on this holdout)"
        unit = f"{rule.max_regression:.2%} of it" if rule.relative else f"{rule.max_regression:g}"
        threshold = f"{op} {bound:.4f} (v{entry.version} -{unit}, tolerated regression)"
        checks.append(Check(name, metric, cand, value, threshold, passed, note))
    return checks


def _time_check(candidate: str | None, champion: str | None) -> Check:
    """The candidate's newest data must not be older than the champion's."""
    from trainyard.volumes.paths import _instant

    name, rule = "time:data", "newest data >= champion's"
    if candidate is None or champion is None:
        whose = "candidate's" if candidate is None else "champion's"
        return Check(name, "data_until", None, None, rule, True, f"{whose} data time unknown")
    try:
        older = _instant(candidate) < _instant(champion)
    except ValueError as e:
        return Check(name, "data_until", None, None, rule, False, f"unreadable data time: {e}")
    if older:
        note = (
            f"trained on data up to {candidate}, older than the champion's (up to {champion}): "
            "not promoted unless forced with a reason"
        )
        return Check(name, "data_until", None, None, rule, False, note)
    return Check(name, "data_until", None, None, rule, True, f"{candidate} vs {champion}")


def decide(
    gate: GateConfig,
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    force: ForceRequest | None = None,
    *,
    candidate_error: str | None = None,
    champion_error: str | None = None,
    data_times: tuple[str | None, str | None] | None = None,
    not_compared: str | None = None,
    lineage: Sequence[LineageScore] = (),
) -> GateDecision:
    """Apply a gate to the candidate's (and the champion's) metrics. Pure: no I/O.

    With ``data_times`` the gate also checks time: a candidate whose newest data (the
    latest interval of its training window) is older than the champion's fails the
    ``time:data`` check, so it is not promoted unless forced (with a reason). With a
    champion rule and a ``lineage``, the candidate is also compared with each version
    served before (``lineage:vN``): at most ``max_regression`` below any of them.

    Args:
        gate: The pipeline's gate.
        candidate: The candidate's metrics (overall and ``<metric>@<column>=<value>``).
        champion: The champion's metrics on the same holdout, or None if there is no
            champion (the first run: thresholds only).
        force: A force-promote request; it promotes over failed checks, and is recorded.
        candidate_error: Why the candidate could not be evaluated (rejects).
        champion_error: Why the champion could not be evaluated (rejects: the gate cannot
            decide), e.g. an unreadable champion pointer.
        data_times: ``(candidate's newest data, champion's newest data)`` as ISO times
            (None where unknown); the champion's is ignored when there is no champion.
        not_compared: Why a champion exists but its metrics cannot be compared (a model of
            another task): thresholds (and time) decide, and the reason says so.
        lineage: The versions served before (not the champion), scored on the candidate's
            holdout; one that could not be scored rejects.

    Returns:
        The decision with every check.
    """
    checks: list[Check] = []
    if not_compared:
        checks.append(Check("champion:comparable", "-", None, None, "-", True, not_compared))
    if candidate_error:
        checks.append(Check("evaluate:candidate", "-", None, None, "-", False, candidate_error))
    if champion_error:
        checks.append(Check("evaluate:champion", "-", None, None, "-", False, champion_error))
    first_run = champion is None and not champion_error and not not_compared and not lineage
    for metric in gate_metrics(gate):
        raw = candidate.get(metric)
        value = _finite(raw)
        note = "" if value is not None else ("missing" if raw is None else f"not finite ({raw!r})")
        champ = _finite((champion or {}).get(metric))
        checks.append(
            Check(f"metric:{metric}", metric, value, champ, "finite", value is not None, note)
        )
    for metric, th in sorted(gate.thresholds.items()):
        checks.append(_threshold_check(f"threshold:{metric}", metric, th, candidate, champion))
    for column in gate.slices:
        prefix = f"@{column}="
        names = sorted(k for k in candidate if prefix in k)
        if not names:
            checks.append(
                Check(
                    f"slice:{column}",
                    "-",
                    None,
                    None,
                    "-",
                    False,
                    f"no metrics for slice column {column!r}",
                )
            )
            continue
        for metric, th in sorted(gate.thresholds.items()):
            if "@" in metric:
                continue
            for name in (k for k in names if k.startswith(metric + prefix)):
                checks.append(
                    _threshold_check(
                        f"slice:{name.split('@', 1)[1]}", name, th, candidate, champion
                    )
                )
    if champion is not None and gate.champion is not None and not champion_error:
        checks.append(_champion_check(gate, candidate, champion))
    if gate.champion is not None and lineage:
        checks += _lineage_checks(gate, candidate, lineage)
    if data_times is not None and (champion is not None or champion_error or not_compared):
        checks.append(_time_check(*data_times))

    failed = [c for c in checks if not c.passed]
    if not checks:
        failed_text = "the gate declares no checks, so it cannot decide"
    else:
        shown = "; ".join(f"{c.name} {c.note or 'failed'}".strip() for c in failed[:3])
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        failed_text = f"{len(failed)} of {len(checks)} checks failed: {shown}{more}"
    ok = bool(checks) and not failed
    champ_part = ""
    if gate.champion and champion is not None and not champion_error:
        c = next(c for c in checks if c.name.startswith("champion:"))
        champ_part = f"; {c.metric} {_fmt(c.candidate)} vs champion {_fmt(c.champion)}"
    served = [c for c in checks if c.name.startswith("lineage:") and c.champion is not None]
    if served and gate.champion is not None:
        pick = max if gate.champion.higher_is_better else min
        best = pick(served, key=lambda c: c.champion or 0.0)
        champ = _finite((champion or {}).get(gate.champion.metric))
        if champ is None or pick(champ, best.champion or 0.0) != champ:
            champ_part += f", best served {_fmt(best.champion)} ({best.name.split(':', 1)[1]})"
        else:
            champ_part += " (the best served on this holdout)"
    if ok:
        verdict: Verdict = "promote"
        first = " (first run: no champion, thresholds only)" if first_run else ""
        if not_compared:
            first = f" (champion not compared: {not_compared}; thresholds only)"
        reason = f"All {len(checks)} checks passed{first}{champ_part}."
        if force:
            reason += f" Force promote by {force.actor} was not needed."
    elif force:
        verdict = "forced"
        reason = (
            f"Forced by {force.actor} at {force.at} ({force.reason}) over the gate: {failed_text}."
        )
    else:
        verdict = "reject"
        reason = f"Rejected: {failed_text}{champ_part}."
    metric = gate.champion.metric if gate.champion else None
    return GateDecision(
        promote=verdict != "reject",
        verdict=verdict,
        reason=reason,
        checks=checks,
        first_run=first_run,
        force=force,
        candidate_metrics=dict(candidate),
        champion_metrics=dict(champion) if champion is not None else None,
        fail_run_on_reject=gate.fail_run_on_reject,
        lineage=[
            {
                "version": e.version,
                "metric": metric,
                "value": _finite(e.metrics.get(metric)) if metric else None,
                "error": e.error,
            }
            for e in sorted(lineage, key=lambda e: e.version)
        ],
    )


def keep(decision: GateDecision, version: int) -> GateDecision:
    """The decision about a candidate that is the champion: it keeps serving.

    A run that reused the version trained on its inputs gets the champion back as its
    candidate; today's checks are reported, nothing is deployed, and the champion's own
    gate record (what it beat when it shipped) is left alone.

    Args:
        decision: The checks of the champion as a candidate (no champion to compare with).
        version: The champion.

    Returns:
        The decision with the verdict ``keep``.
    """
    failed = [c for c in decision.checks if not c.passed]
    today = (
        f"today {len(failed)} of {len(decision.checks)} checks fail: "
        + "; ".join(f"{c.name} {c.note or 'failed'}".strip() for c in failed[:3])
        + " (a person decides: python -m trainyard models rollback)"
        if failed
        else f"all {len(decision.checks)} checks still pass"
    )
    return dataclasses.replace(
        decision,
        promote=False,
        verdict="keep",
        reason=f"Version {version} is the champion and keeps serving: nothing to deploy; {today}.",
        first_run=False,
        version=version,
        champion_version=version,
    )
