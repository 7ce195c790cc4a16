"""Drift of a new snapshot against the last validated one, in bounded memory.

Per drift rule, both snapshots are reduced to a small profile while their batches stream
by: value counts for ``psi`` on a categorical column; count, mean, variance (merged with
Chan's parallel formula) and a fixed-edge histogram for numeric columns. The histogram
edges come from the previous snapshot (``bins`` equal-width bins between its min and max,
plus open-ended tails), so both sides bin identically.

* ``psi``: population stability index, ``sum((p - q) * ln(p / q))`` over categories (or
  histogram bins), proportions floored at ``1e-4`` so a vanished class scores high.
* ``chi2``: the chi-square test of homogeneity of the two snapshots' category counts
  (a 2 x k table); the value is Cramér's V, ``sqrt(chi2 / n)`` (n: both snapshots' rows),
  in [0, 1] whatever the row counts, where the test's p-value says little on large
  samples. The report gives chi2, its degrees of freedom (k - 1) and the p-value too.
* ``ks``: Kolmogorov-Smirnov distance ``max |F_new - F_old|`` evaluated at the histogram
  edges (1000 bins: a lower bound within one bin's mass of the exact statistic).
* ``mean_shift``: ``|mean_new - mean_old| / std_old``.
* ``std_shift``: ``|std_new / std_old - 1|``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from trainyard.contracts import DriftRule

KS_BINS = 1000
PSI_FLOOR = 1e-4


@dataclass
class NumericStats:
    """Streaming count / mean / M2 / min / max of a numeric column."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def update(self, values: np.ndarray) -> None:
        """Merge a batch of non-null values."""
        import numpy as np

        n = int(values.size)
        if n == 0:
            return
        values = values.astype(np.float64, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):  # 1e308: inf, not a warning line
            mean = float(values.mean())
            m2 = float(((values - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    @property
    def std(self) -> float:
        """Population standard deviation."""
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


@dataclass
class ColumnProfile:
    """What one drift rule needs from one snapshot's column."""

    categorical: bool
    edges: np.ndarray | None = None
    counts: Counter[Any] = field(default_factory=Counter)
    hist: np.ndarray | None = None
    stats: NumericStats = field(default_factory=NumericStats)

    def update(self, values: Any) -> None:
        """Merge a batch of the column (a pandas Series; nulls are ignored)."""
        import numpy as np

        values = values.dropna()
        if self.categorical:
            self.counts.update(values.value_counts(sort=False).to_dict())
            return
        arr = values.to_numpy(dtype=np.float64)
        self.stats.update(arr)
        if self.edges is not None:
            self._bin(arr)

    def update_histogram(self, values: Any) -> None:
        """Bin a batch into the histogram only (second pass once the edges are known)."""
        import numpy as np

        self._bin(values.dropna().to_numpy(dtype=np.float64))

    def _bin(self, arr: np.ndarray) -> None:
        import numpy as np

        idx = np.searchsorted(self.edges, arr, side="right")
        binned = np.bincount(idx, minlength=len(self.edges) + 1)
        self.hist = binned if self.hist is None else self.hist + binned


def histogram_edges(stats: NumericStats, bins: int) -> np.ndarray:
    """Interior bin edges spanning the previous snapshot's range (tails stay open)."""
    import numpy as np

    lo, hi = stats.min, stats.max
    if not math.isfinite(lo) or lo == hi:
        return np.array([lo if math.isfinite(lo) else 0.0])
    return np.linspace(lo, hi, bins + 1)


def _psi(p: np.ndarray, q: np.ndarray) -> float:
    import numpy as np

    p = np.maximum(p / max(p.sum(), 1), PSI_FLOOR)
    q = np.maximum(q / max(q.sum(), 1), PSI_FLOOR)
    return float(((p - q) * np.log(p / q)).sum())


def chi_square(new: ColumnProfile, old: ColumnProfile) -> dict[str, float]:
    """The chi-square test of homogeneity of two categorical profiles' counts.

    Returns:
        ``cramers_v``, ``chi2``, ``dof`` and ``p_value`` (0 degrees of freedom: one
        category in all, nothing moved: V 0, p 1).
    """
    import numpy as np

    keys = sorted(set(new.counts) | set(old.counts), key=str)
    table = np.array(
        [[new.counts.get(k, 0) for k in keys], [old.counts.get(k, 0) for k in keys]],
        dtype=np.float64,
    )
    n = table.sum()
    dof = len(keys) - 1
    if dof < 1 or n == 0 or table.sum(axis=1).min() == 0:
        return {"cramers_v": 0.0, "chi2": 0.0, "dof": float(max(dof, 0)), "p_value": 1.0}
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / n
    stat = float(((table - expected) ** 2 / expected).sum())
    from scipy.stats import chi2 as chi2_distribution

    return {
        "cramers_v": math.sqrt(stat / n),
        "chi2": stat,
        "dof": float(dof),
        "p_value": float(chi2_distribution.sf(stat, dof)),
    }


def category_shares(new: ColumnProfile, old: ColumnProfile, most: int = 12) -> list[list[Any]]:
    """``[value, share now, share before]`` of the categories most frequent in either.

    The rest are summed into one ``(other)`` row, so the shares add up to 1 each.
    """
    total_new = max(sum(new.counts.values()), 1)
    total_old = max(sum(old.counts.values()), 1)
    weight = {k: new.counts.get(k, 0) / total_new + old.counts.get(k, 0) / total_old
              for k in set(new.counts) | set(old.counts)}  # fmt: skip
    ranked = sorted(weight, key=lambda k: (-weight[k], str(k)))
    rows = [[k, new.counts.get(k, 0) / total_new, old.counts.get(k, 0) / total_old]
            for k in ranked[:most]]  # fmt: skip
    if len(ranked) > most:
        rows.append(["(other)", 1 - sum(r[1] for r in rows), 1 - sum(r[2] for r in rows)])
    return rows


def drift_value(rule: DriftRule, new: ColumnProfile, old: ColumnProfile) -> float:
    """The drift statistic of ``rule`` between two profiles (see the module docstring)."""
    import numpy as np

    if rule.method == "chi2":
        return chi_square(new, old)["cramers_v"]
    if rule.method == "psi" and new.categorical:
        keys = sorted(set(new.counts) | set(old.counts), key=str)
        p = np.array([new.counts.get(k, 0) for k in keys], dtype=np.float64)
        q = np.array([old.counts.get(k, 0) for k in keys], dtype=np.float64)
        return _psi(p, q)
    if rule.method == "psi":
        return _psi(new.hist.astype(np.float64), old.hist.astype(np.float64))
    if rule.method == "ks":
        f_new = np.cumsum(new.hist) / max(new.hist.sum(), 1)
        f_old = np.cumsum(old.hist) / max(old.hist.sum(), 1)
        return float(np.abs(f_new - f_old).max())
    old_std = old.stats.std
    if rule.method == "mean_shift":
        delta = abs(new.stats.mean - old.stats.mean)
        if old_std == 0:
            return 0.0 if delta == 0 else math.inf
        return delta / old_std
    if old_std == 0:
        return 0.0 if new.stats.std == 0 else math.inf
    return abs(new.stats.std / old_std - 1)


def needs_edges(rule: DriftRule, categorical: bool) -> bool:
    """Whether the rule bins numeric values (``psi`` on numbers, ``ks``)."""
    return not categorical and rule.method in ("psi", "ks")


def rule_bins(rule: DriftRule) -> int:
    """Number of histogram bins the rule uses."""
    return KS_BINS if rule.method == "ks" else rule.bins
