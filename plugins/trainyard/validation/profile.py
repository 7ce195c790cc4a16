"""Column profiles of a snapshot: null shares, category frequencies, unseen categories.

While validation streams a snapshot's batches, :class:`SnapshotProfile` counts each
column's nulls and, for its categorical columns (string and integer-coded features,
columns with ``allowed_values``, ``max_unseen_share`` or a categorical drift rule), the
frequency of every category (Arrow's ``value_counts`` per batch; at most
:data:`MAX_DISTINCT` distinct values are counted). Against the baseline snapshot's
categories (:func:`baseline_categories`: the drift baseline, the validated snapshot of
the interval before) it counts the values the baseline never held. The profile becomes the
``profile`` section of the validation report, and the ``max_null_share`` and
``max_unseen_share`` rules' outcomes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from trainyard.contracts import Column, Contract

MAX_DISTINCT = 100_000
"""Distinct values counted per column; past it, new values are not counted (``truncated``)."""
TOP_CATEGORIES = 20
"""Categories listed per column in the report (most frequent first)."""


def categorical_columns(contract: Contract) -> list[str]:
    """The columns whose categories are counted, in contract order."""
    drifting = {d.column for d in contract.drift if d.method in ("psi", "chi2")}
    out = []
    for col in contract.columns:
        feature = contract.features.get(col.name)
        countable = col.type in ("string", "int32", "int64", "bool")
        if countable and (
            (feature is not None and feature.categorical)
            or col.allowed_values is not None
            or col.max_unseen_share is not None
            or col.type == "bool"
            or (col.name in drifting and col.type == "string")
        ):
            out.append(col.name)
    return out


@dataclass
class ColumnCounts:
    """One column's counts over a snapshot."""

    rows: int = 0
    nulls: int = 0
    categories: Counter[Any] | None = None
    truncated: bool = False
    unseen: int = 0
    unseen_values: Counter[Any] = field(default_factory=Counter)


def _value_counts(arr: pa.Array) -> list[tuple[Any, int]]:
    import pyarrow.compute as pc

    counted = pc.value_counts(arr.drop_null())
    return list(
        zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True)
    )


class SnapshotProfile:
    """Null counts of every column and categories of the categorical ones, batch by batch.

    Args:
        contract: The dataset's contract.
        baseline: Categories per column of the baseline snapshot
            (:func:`baseline_categories`), or None without one.
    """

    def __init__(self, contract: Contract, baseline: dict[str, set[Any]] | None = None) -> None:
        self.contract = contract
        self.baseline = baseline
        self.categorical = set(categorical_columns(contract))
        self.columns = {
            c.name: ColumnCounts(categories=Counter() if c.name in self.categorical else None)
            for c in contract.columns
        }
        self._baseline_arrays: dict[str, Any] = {}

    def update(self, batch: pa.RecordBatch) -> None:
        """Count one batch (a record batch of the snapshot's table view)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for name, counts in self.columns.items():
            arr = batch.column(name)
            counts.rows += len(arr)
            counts.nulls += arr.null_count
            if counts.categories is None:
                continue
            for value, n in _value_counts(arr):
                if value in counts.categories or len(counts.categories) < MAX_DISTINCT:
                    counts.categories[value] += n
                else:
                    counts.truncated = True
            if self.baseline is not None and name in self.baseline:
                known = self._baseline_arrays.get(name)
                if known is None:
                    known = pa.array(sorted(self.baseline[name], key=str), type=arr.type)
                    self._baseline_arrays[name] = known
                present = arr.drop_null()
                unseen = present.filter(pc.invert(pc.is_in(present, value_set=known)))
                counts.unseen += len(unseen)
                if len(unseen) and len(counts.unseen_values) < MAX_DISTINCT:
                    counts.unseen_values.update(dict(_value_counts(unseen)))

    def summary(self) -> dict[str, dict[str, Any]]:
        """The report's ``profile``: per column rows, nulls, null share, and categories.

        A categorical column also has ``distinct``, ``categories`` (``[value, count,
        share]`` of the :data:`TOP_CATEGORIES` most frequent), ``other`` (the count of
        the rest) and, against a baseline, ``unseen`` and ``unseen_share`` (of its
        non-null values).
        """
        out: dict[str, dict[str, Any]] = {}
        for name, c in self.columns.items():
            entry: dict[str, Any] = {
                "rows": c.rows,
                "nulls": c.nulls,
                "null_share": c.nulls / c.rows if c.rows else 0.0,
            }
            if c.categories is not None:
                present = max(c.rows - c.nulls, 0)
                top = sorted(c.categories.items(), key=lambda vc: (-vc[1], str(vc[0])))
                shown = top[:TOP_CATEGORIES]
                entry.update(
                    distinct=len(c.categories),
                    truncated=c.truncated,
                    categories=[[v, n, n / present if present else 0.0] for v, n in shown],
                    other=sum(n for _, n in top[TOP_CATEGORIES:]),
                )
                if self.baseline is not None and name in self.baseline:
                    entry.update(
                        unseen=c.unseen,
                        unseen_share=c.unseen / present if present else 0.0,
                        unseen_values=[
                            v for v, _ in sorted(c.unseen_values.items(), key=_by_count)[:10]
                        ],
                    )
            out[name] = entry
        return out

    def outcomes(self) -> list[tuple[Column, str, bool, str, Any, int, int, list[Any]]]:
        """The ``max_null_share`` and ``max_unseen_share`` rules' results.

        Returns:
            ``(column, rule, ok, reason, observed share, count, of how many, samples)``
            per declared rule; ``max_unseen_share`` only against a baseline.
        """
        results = []
        for col in self.contract.columns:
            c = self.columns[col.name]
            if col.max_null_share is not None:
                share = c.nulls / c.rows if c.rows else 0.0
                ok = share <= col.max_null_share
                reason = (
                    ""
                    if ok
                    else f"{share:.2%} of the rows are null, the contract allows "
                    f"{col.max_null_share:.2%}"
                )
                results.append((col, "max_null_share", ok, reason, share, c.nulls, c.rows, []))
            if col.max_unseen_share is not None and self.baseline is not None:
                present = max(c.rows - c.nulls, 0)
                share = c.unseen / present if present else 0.0
                ok = share <= col.max_unseen_share
                samples = [v for v, _ in sorted(c.unseen_values.items(), key=_by_count)[:5]]
                reason = (
                    ""
                    if ok
                    else f"{share:.2%} of the values are categories the baseline snapshot never "
                    f"held, the contract allows {col.max_unseen_share:.2%}"
                )
                results.append(
                    (col, "max_unseen_share", ok, reason, share, c.unseen, present, samples)
                )
        return results


def _by_count(item: tuple[Any, int]) -> tuple[int, str]:
    return -item[1], str(item[0])


def baseline_categories(
    contract: Contract, files: Sequence[Path], batch_rows: int
) -> dict[str, set[Any]]:
    """The categories each categorical column of the baseline snapshot holds.

    Args:
        contract: The dataset's contract.
        files: The baseline snapshot's table files.
        batch_rows: Rows per batch read.

    Returns:
        Column → its distinct non-null values (at most :data:`MAX_DISTINCT`), for the
        categorical columns the baseline has.
    """
    import pyarrow.parquet as pq

    wanted = categorical_columns(contract)
    seen: dict[str, set[Any]] = {}
    for path in files:
        pf = pq.ParquetFile(path)
        columns = [c for c in wanted if c in pf.schema_arrow.names]
        for name in columns:
            seen.setdefault(name, set())
        if not columns:
            continue
        for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
            for name in columns:
                values = seen[name]
                if len(values) < MAX_DISTINCT:
                    values.update(v for v, _ in _value_counts(batch.column(name)))
    return seen
