"""Run a contract's suite on a snapshot's table view in bounded memory.

The Parquet files are read with pyarrow in batches of ``batch_rows`` rows; each batch is
validated by GX against the batch-scope part of the suite and the per-expectation results
are merged (counts add up, the first unexpected samples are kept in row order, indexes are
shifted to snapshot row numbers). Dataset-scope rules are computed over the whole snapshot
while the batches stream by: the row count from all batches, uniqueness from 64-bit key
hashes spilled to disk in hash-prefix buckets (so memory is one bucket, not the data),
the set of allowed values seen, freshness, the drift profiles, and the column profiles
(null shares, category frequencies, categories the baseline never held:
:mod:`trainyard.validation.profile`).
"""

from __future__ import annotations

import math
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.errors import SnapshotError, TrainyardError
from trainyard.progress import Progress
from trainyard.validation.drift import (
    ColumnProfile,
    category_shares,
    chi_square,
    drift_value,
    histogram_edges,
    needs_edges,
)
from trainyard.validation.drift import rule_bins as drift_bins
from trainyard.validation.profile import SnapshotProfile, baseline_categories
from trainyard.validation.suite import build_suite, rule_meta

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainyard.contracts import Contract

DEFAULT_BATCH_ROWS = 250_000
SAMPLES = 20


class ValidatorCrashed(TrainyardError):
    """The validator itself failed (a bug or an environment problem), not the data."""


@dataclass
class RuleOutcome:
    """The result of one rule of the contract on one snapshot."""

    rule: str
    column: str | None
    severity: str
    success: bool
    reason: str = ""
    unexpected_count: int | None = None
    element_count: int | None = None
    samples: list[Any] = field(default_factory=list)
    observed: Any = None
    rows: list[int] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)
    """The key column's value of each of ``rows`` (rows count from 0 through the snapshot,
    which no source file's line numbers match: the key finds the record)."""
    details: dict[str, Any] = field(default_factory=dict)
    """More of what was measured: a categorical drift rule's category shares now and
    before (``categories``: ``[value, share, share before]``), a ``chi2`` rule's test."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (sample values as strings if they are not JSON scalars)."""
        d = asdict(self)
        d["samples"] = [_jsonable(v) for v in self.samples]
        d["keys"] = [_jsonable(v) for v in self.keys]
        d["observed"] = _jsonable(self.observed)
        d["details"] = {k: _jsonable(v) for k, v in self.details.items()}
        return d


@dataclass
class RunOutput:
    """Everything one run produced: rule outcomes and the merged GX result."""

    outcomes: list[RuleOutcome]
    gx_result: Any
    rows: int
    batches: int
    seconds: float
    profile: dict[str, dict[str, Any]] = field(default_factory=dict)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


def _type_matches(arrow_type: pa.DataType, contract_type: str) -> bool:
    import pyarrow as pa

    checks = {
        "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        "int32": lambda t: t == pa.int32(),
        "int64": lambda t: t == pa.int64(),
        "float32": lambda t: t == pa.float32(),
        "float64": lambda t: t == pa.float64(),
        "bool": pa.types.is_boolean,
        "timestamp": pa.types.is_timestamp,
    }
    return bool(checks[contract_type](arrow_type))


def open_files(files: Sequence[Path]) -> list[pq.ParquetFile]:
    """Open the Parquet files of a table view.

    Raises:
        SnapshotError: If a file is missing or not readable Parquet (names the file).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    opened = []
    for path in files:
        try:
            opened.append(pq.ParquetFile(path))
        except (OSError, pa.ArrowException) as e:
            raise SnapshotError(f"{path}: cannot read Parquet file: {e}") from e
    return opened


def schema_outcomes(
    contract: Contract, files: Sequence[Path], opened: Sequence[Any]
) -> list[RuleOutcome]:
    """Compare each file's Arrow schema with the contract's columns.

    Returns:
        One failing ``schema`` outcome per missing, retyped or unexpected column per file
        (empty if every file matches).
    """
    out: list[RuleOutcome] = []
    wanted = {c.name: c for c in contract.columns}
    for path, pf in zip(files, opened, strict=True):
        schema = pf.schema_arrow
        names = set(schema.names)
        for col in contract.columns:
            if col.name not in names:
                reason = f"{path.name}: column {col.name!r} is missing (renamed or dropped?)"
                out.append(RuleOutcome("schema", col.name, "error", False, reason))
            elif not _type_matches(schema.field(col.name).type, col.type):
                actual = schema.field(col.name).type
                reason = (
                    f"{path.name}: column {col.name!r} is {actual}, the contract says {col.type}"
                )
                out.append(
                    RuleOutcome("schema", col.name, "error", False, reason, observed=str(actual))
                )
        if not contract.allow_extra_columns:
            for name in schema.names:
                if name not in wanted:
                    reason = f"{path.name}: unexpected column {name!r} (not in the contract)"
                    out.append(RuleOutcome("schema", name, "error", False, reason))
    return out


def iter_batches(
    opened: Sequence[Any], columns: list[str], batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, pd.DataFrame]]:
    """Yield the snapshot's rows in batches of at most ``batch_rows``: Arrow and pandas.

    The next batch is read and converted in a helper thread (pyarrow releases the GIL)
    while the caller works on the current one; at most two batches are in memory.
    """
    from concurrent.futures import ThreadPoolExecutor

    def batches() -> Iterator[Any]:
        for pf in opened:
            yield from pf.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True)

    def convert(source: Iterator[Any]) -> tuple[pa.RecordBatch, pd.DataFrame] | None:
        batch = next(source, None)
        return None if batch is None else (batch, batch.to_pandas())

    source = batches()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainyard-read") as pool:
        pending = pool.submit(convert, source)
        while True:
            item = pending.result()
            if item is None:
                return
            pending = pool.submit(convert, source)
            yield item


_MASK64 = (1 << 64) - 1


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every input bit over the 64 output bits."""
    import numpy as np

    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(30))
        h = h * np.uint64(0xBF58476D1CE4E5B9)
        h = h ^ (h >> np.uint64(27))
        h = h * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


@lru_cache(maxsize=8)
def _byte_weights(size: int) -> np.ndarray:
    import numpy as np

    rng = np.random.default_rng(0x7261696E79617264)
    return rng.integers(0, 1 << 63, size=size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _hash_strings(arr: pa.Array) -> np.ndarray:
    """64-bit hashes of the non-null strings of an Arrow array, vectorised over its buffers.

    Each string is ``sum(byte_i * w_i) mod 2^64`` with fixed random odd weights per
    position, mixed with its length and finalised with splitmix64.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pc.drop_null(arr)
    if pa.types.is_large_string(arr.type):
        off_type = np.int64
    else:
        arr = arr.cast(pa.string())
        off_type = np.int32
    n = len(arr)
    if n == 0:
        return np.empty(0, np.uint64)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=off_type)[arr.offset : arr.offset + n + 1].astype(
        np.int64
    )
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    data = data[offsets[0] : offsets[-1]]
    starts = offsets[:-1] - offsets[0]
    lengths = np.diff(offsets)
    longest = int(lengths.max())
    size = 1 << max(6, (longest - 1).bit_length())
    pos = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
    with np.errstate(over="ignore"):
        contrib = data.astype(np.uint64) * _byte_weights(size)[pos]
        sums = np.add.reduceat(np.append(contrib, np.uint64(0)), np.minimum(starts, len(data)))
        sums[lengths == 0] = 0
        sums = sums + lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return _mix64(sums)


def _hash_values(arr: pa.Array) -> np.ndarray:
    """64-bit hashes of the non-null values of an Arrow array (strings, integers, ...)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return _hash_strings(arr)
    values = pc.drop_null(arr)
    if not pa.types.is_integer(values.type):
        values = values.cast(pa.int64())
    ints = values.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return _mix64(ints.view(np.uint64))


def _valid_positions(arr: pa.Array) -> np.ndarray:
    import numpy as np

    if arr.null_count == 0:
        return np.arange(len(arr))
    return np.flatnonzero(~np.asarray(arr.is_null()))


class KeyUniqueness:
    """Exact-duplicate detection over all batches in memory bounded by one hash bucket.

    Keys are hashed to 64 bits; hashes are spilled to ``nbuckets`` files by their top bits
    (sized so a bucket holds about ``batch_rows`` hashes), and each bucket is checked on its
    own. A 64-bit collision between distinct keys has probability about n^2 / 2^65.
    """

    def __init__(self, total_rows: int, batch_rows: int, work_dir: Path) -> None:
        wanted = max(1, math.ceil(total_rows / max(batch_rows, 1)))
        self.bits = min(10, max(0, math.ceil(math.log2(wanted))))
        self.memory: list[np.ndarray] = []
        self.files: list[Any] = []
        if self.bits:
            for i in range(1 << self.bits):
                self.files.append(open(work_dir / f"keys-{i:04d}.u64", "wb"))  # noqa: SIM115
        self.element_count = 0
        self.missing_count = 0

    def add(self, values: pa.Array) -> None:
        """Add a batch of key values (nulls are counted, not hashed)."""
        import numpy as np

        self.element_count += len(values)
        self.missing_count += values.null_count
        hashes = _hash_values(values)
        if not self.bits:
            self.memory.append(hashes)
            return
        bucket = hashes >> np.uint64(64 - self.bits)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange((1 << self.bits) + 1))
        sorted_hashes = hashes[order]
        for i, fh in enumerate(self.files):
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                sorted_hashes[lo:hi].tofile(fh)

    def duplicates(self) -> tuple[np.ndarray, int]:
        """Hashes that occur more than once, and the number of rows carrying them."""
        import numpy as np

        dup_parts = []
        rows = 0
        chunks: Iterator[np.ndarray]
        if not self.bits:
            chunks = iter([np.concatenate(self.memory) if self.memory else np.empty(0, np.uint64)])
        else:
            for fh in self.files:
                fh.close()
            chunks = (np.fromfile(fh.name, dtype=np.uint64) for fh in self.files)
        for chunk in chunks:
            values, counts = np.unique(chunk, return_counts=True)
            many = counts > 1
            dup_parts.append(values[many])
            rows += int(counts[many].sum())
        dups = np.concatenate(dup_parts) if dup_parts else np.empty(0, np.uint64)
        return dups, rows

    def close(self) -> None:
        """Close the spill files (they live in the caller's work dir)."""
        for fh in self.files:
            fh.close()


def _merge_map_result(acc: dict[str, Any], result: dict[str, Any], offset: int) -> None:
    for key in ("element_count", "unexpected_count", "missing_count"):
        if key in result:
            acc[key] = acc.get(key, 0) + int(result[key] or 0)
    samples = acc.setdefault("partial_unexpected_list", [])
    indexes = acc.setdefault("partial_unexpected_index_list", [])
    room = SAMPLES - len(samples)
    if room > 0:
        samples.extend(result.get("partial_unexpected_list", [])[:room])
        indexes.extend(
            int(i) + offset for i in result.get("partial_unexpected_index_list", [])[:room]
        )


def _finish_map_result(acc: dict[str, Any]) -> dict[str, Any]:
    element = acc.get("element_count", 0)
    unexpected = acc.setdefault("unexpected_count", 0)
    if "missing_count" in acc:
        missing = acc["missing_count"]
        nonmissing = element - missing
        acc["missing_percent"] = 100.0 * missing / element if element else None
        acc["unexpected_percent"] = 100.0 * unexpected / nonmissing if nonmissing else None
        acc["unexpected_percent_total"] = 100.0 * unexpected / element if element else None
        acc["unexpected_percent_nonmissing"] = acc["unexpected_percent"]
    else:
        acc["unexpected_percent"] = 100.0 * unexpected / element if element else None
    acc.setdefault("partial_unexpected_list", [])
    counts = Counter(acc.get("partial_unexpected_list", []))
    acc["partial_unexpected_counts"] = [
        {"value": v, "count": c}
        for v, c in sorted(counts.items(), key=lambda vc: (-vc[1], str(vc[0])))
    ]
    return acc


def _num(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _describe(meta: dict[str, Any], kwargs: dict[str, Any], result: dict[str, Any]) -> str:
    n = result.get("unexpected_count", 0)
    rule = meta["rule"]
    if rule == "nullable":
        return f"{n} null value(s) in a non-null column"
    if rule in ("range", "min", "max"):
        lo = kwargs.get("min_value")
        hi = kwargs.get("max_value")
        left = "(" if kwargs.get("strict_min") else "["
        right = ")" if kwargs.get("strict_max") else "]"
        lo_text = "-inf" if lo is None else _num(lo)
        hi_text = "inf" if hi is None else _num(hi)
        return f"{n} value(s) outside {left}{lo_text}, {hi_text}{right}"
    if rule == "allowed_values":
        return f"{n} value(s) not in the allowed set {kwargs.get('value_set')}"
    if rule == "regex":
        return f"{n} value(s) do not match /{kwargs.get('regex')}/"
    if rule == "length":
        bounds = f"[{kwargs.get('min_value')}, {kwargs.get('max_value')}]"
        return f"{n} value(s) with a length outside {bounds}"
    return f"{n} unexpected value(s)"


class _GXBatchValidator:
    """One ephemeral GX context with a pandas datasource, reused for every batch."""

    def __init__(self, suite: Any) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        name = f"trainyard-{uuid.uuid4().hex[:8]}"
        asset = self.context.data_sources.add_pandas(name).add_dataframe_asset("snapshot")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("batch")
        self.suite = suite

    def validate(self, df: pd.DataFrame) -> list[Any]:
        """Run the suite on one batch; GX's per-expectation results.

        This is what ``Batch.validate`` does, minus its second ``get_batch`` (GX
        fingerprints the whole frame on every ``get_batch``).
        """
        request = self.batch_definition.build_batch_request(batch_parameters={"dataframe": df})
        validator = self.context.get_validator(batch_request=request)
        configs = validator.process_expectations_for_validation(
            self.suite.expectation_configurations, None
        )
        results = validator.graph_validate(
            configurations=configs, runtime_configuration={"result_format": "SUMMARY"}
        )
        for r in results:
            info = r.exception_info or {}
            infos = info.values() if info and "raised_exception" not in info else [info]
            for item in infos:
                if isinstance(item, dict) and item.get("raised_exception"):
                    raise ValidatorCrashed(
                        f"GX failed on {r.expectation_config.type} "
                        f"{r.expectation_config.kwargs}: {item.get('exception_message')}"
                    )
        return results


def _read_profiles(
    contract: Contract, files: Sequence[Path], batch_rows: int
) -> tuple[dict[int, ColumnProfile], list[RuleOutcome]]:
    """Profile the previous snapshot for every drift rule (two passes when binning)."""
    opened = open_files(files)
    present = set.intersection(*(set(pf.schema_arrow.names) for pf in opened)) if opened else set()
    profiles: dict[int, ColumnProfile] = {}
    problems: list[RuleOutcome] = []
    for i, rule in enumerate(contract.drift):
        col = contract.column(rule.column)
        if rule.column not in present:
            reason = f"cannot compare: column {rule.column!r} is not in the previous snapshot"
            problems.append(RuleOutcome(f"drift:{rule.method}", rule.column, "warn", False, reason))
            continue
        categorical = (not col.numeric and col.type != "bool") or rule.method == "chi2"
        profiles[i] = ColumnProfile(categorical=categorical)
    columns = sorted({contract.drift[i].column for i in profiles})
    if not columns:
        return profiles, problems
    for _, df in iter_batches(opened, columns, batch_rows):
        for i, prof in profiles.items():
            prof.update(df[contract.drift[i].column])
    binned = {i: p for i, p in profiles.items() if needs_edges(contract.drift[i], p.categorical)}
    for i, prof in binned.items():
        prof.edges = histogram_edges(prof.stats, drift_bins(contract.drift[i]))
    if binned:
        binned_columns = sorted({contract.drift[i].column for i in binned})
        for _, df in iter_batches(opened, binned_columns, batch_rows):
            for i, prof in binned.items():
                prof.update_histogram(df[contract.drift[i].column])
    return profiles, problems


def run_contract(
    contract: Contract,
    files: Sequence[Path],
    *,
    previous_files: Sequence[Path] | None = None,
    previous_id: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    work_dir: Path | None = None,
    created_at: str | None = None,
    now: float | None = None,
) -> RunOutput:
    """Validate a snapshot's table view against its contract, batch by batch.

    Args:
        contract: The dataset's contract.
        files: The snapshot's table-view Parquet files (``volumes.table_files``).
        previous_files: Table files of the last validated snapshot (drift), if any.
        previous_id: Its snapshot id (named in drift reasons).
        batch_rows: Rows per batch: memory is bounded by this, not by the data size.
        work_dir: Where key-hash buckets are spilled (a temporary dir by default).
        created_at: The snapshot's creation time (ISO 8601), for freshness without column.
        now: The current time (epoch seconds), for freshness.

    Returns:
        Every rule's outcome and the merged GX suite result.

    Raises:
        SnapshotError: If a file cannot be read.
        ValidatorCrashed: If GX raised inside an expectation.
    """
    import datetime as dt

    import numpy as np
    from great_expectations.core import (
        ExpectationSuiteValidationResult,
        ExpectationValidationResult,
    )

    start = time.perf_counter()
    opened = open_files(files)
    schema_problems = schema_outcomes(contract, files, opened)
    full_suite = build_suite(contract)
    if schema_problems:
        return RunOutput(schema_problems, None, 0, 0, time.perf_counter() - start)
    total_rows = sum(pf.metadata.num_rows for pf in opened)
    batch_suite = build_suite(contract, scopes=("batch",))
    validator = _GXBatchValidator(batch_suite) if batch_suite.expectations else None
    merged: dict[tuple[str, str | None], dict[str, Any]] = {
        _rule_key(e.meta): {} for e in batch_suite.expectations
    }
    dataset_exps = [e for e in full_suite.expectations if rule_meta(e)["scope"] == "dataset"]
    unique_cols = [e.column for e in dataset_exps if rule_meta(e)["rule"] == "unique"]
    contain = {
        e.column: set(e.value_set)
        for e in dataset_exps
        if rule_meta(e)["rule"] == "all_values_present"
    }
    seen: dict[str, set[Any]] = {c: set() for c in contain}
    fresh = contract.rules.freshness
    newest: Any = None
    previous, drift_problems = (
        _read_profiles(contract, previous_files, batch_rows)
        if previous_files is not None
        else ({}, [])
    )
    current = {
        i: ColumnProfile(categorical=p.categorical, edges=p.edges) for i, p in previous.items()
    }
    baseline = (
        baseline_categories(contract, previous_files, batch_rows)
        if previous_files is not None
        else None
    )
    profile = SnapshotProfile(contract, baseline)
    rows = 0
    batches = 0
    progress = Progress(f"validating {contract.dataset}", total_rows, unit="rows", items="batches")
    with tempfile.TemporaryDirectory(prefix="trainyard-keys-", dir=work_dir) as tmp:
        uniq: dict[str, KeyUniqueness] = {}
        for col in unique_cols:
            (Path(tmp) / col).mkdir()
            uniq[col] = KeyUniqueness(total_rows, batch_rows, Path(tmp) / col)
        try:
            for batch, df in iter_batches(opened, contract.column_names, batch_rows):
                if validator is not None and len(df):
                    for r in validator.validate(df):
                        _merge_map_result(
                            merged[_rule_key(r.expectation_config.meta)], r.result, rows
                        )
                profile.update(batch)
                for col, acc in uniq.items():
                    acc.add(batch.column(col))
                for col, wanted in contain.items():
                    seen[col] |= wanted.intersection(df[col].dropna().unique().tolist())
                if fresh is not None and fresh.column is not None and len(df):
                    batch_max = df[fresh.column].max()
                    if batch_max is not None and (newest is None or batch_max > newest):
                        newest = batch_max
                for i, prof in current.items():
                    prof.update(df[contract.drift[i].column])
                rows += len(df)
                batches += 1
                progress.advance(len(df), 1)
            dup_info = {col: acc.duplicates() for col, acc in uniq.items()}
        finally:
            progress.close()
            for acc in uniq.values():
                acc.close()
    if rows != total_rows:
        raise SnapshotError(f"read {rows} rows but the Parquet metadata says {total_rows}")
    dup_samples = _duplicate_samples(opened, dup_info, batch_rows)

    outcomes: list[RuleOutcome] = []
    gx_results = []
    for exp in full_suite.expectations:
        meta = rule_meta(exp)
        kwargs = dict(exp.configuration.kwargs)
        if meta["scope"] == "batch":
            res = _finish_map_result(merged.get(_rule_key(exp.meta), {}) or {"element_count": rows})
            ok = res.get("unexpected_count", 0) == 0
            reason = "" if ok else _describe(meta, kwargs, res)
            outcome = RuleOutcome(
                meta["rule"],
                meta["column"],
                meta["severity"],
                ok,
                reason,
                res.get("unexpected_count", 0),
                res.get("element_count", rows),
                res.get("partial_unexpected_list", []),
                rows=res.get("partial_unexpected_index_list", []),
            )
        elif meta["rule"] == "row_count":
            lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
            ok = (lo is None or rows >= lo) and (hi is None or rows <= hi)
            res = {"observed_value": rows}
            reason = "" if ok else f"{rows} rows, the contract allows [{lo}, {hi}]"
            outcome = RuleOutcome("row_count", None, meta["severity"], ok, reason, observed=rows)
        elif meta["rule"] == "unique":
            col = meta["column"]
            dups, dup_rows = dup_info[col]
            acc = uniq[col]
            res = _finish_map_result(
                {
                    "element_count": acc.element_count,
                    "missing_count": acc.missing_count,
                    "unexpected_count": dup_rows,
                    "partial_unexpected_list": dup_samples[col][0],
                    "partial_unexpected_index_list": dup_samples[col][1],
                }
            )
            ok = dup_rows == 0
            reason = (
                ""
                if ok
                else f"{dup_rows} row(s) share a key value with another row "
                f"({len(dups)} value(s) repeated)"
            )
            outcome = RuleOutcome(
                "unique",
                col,
                meta["severity"],
                ok,
                reason,
                dup_rows,
                acc.element_count,
                res["partial_unexpected_list"],
                rows=res["partial_unexpected_index_list"],
            )
        else:
            col = meta["column"]
            missing = sorted(contain[col] - seen[col], key=str)
            ok = not missing
            res = {"observed_value": sorted(seen[col], key=str), "details": {"missing": missing}}
            reason = "" if ok else f"allowed value(s) never seen: {missing} (a class disappeared?)"
            outcome = RuleOutcome(
                "all_values_present", col, meta["severity"], ok, reason, observed=missing
            )
        outcomes.append(outcome)
        gx_results.append(
            ExpectationValidationResult(
                success=ok, expectation_config=exp.configuration, result=res
            )
        )

    if fresh is not None:
        now_dt = dt.datetime.fromtimestamp(time.time() if now is None else now, tz=dt.UTC)
        stamp = _as_utc(newest) if fresh.column else (_as_utc(created_at) if created_at else None)
        what = f"newest {fresh.column!r}" if fresh.column else "snapshot creation"
        if stamp is None:
            outcomes.append(
                RuleOutcome(
                    "freshness", fresh.column, fresh.severity, False, f"no {what} time to check"
                )
            )
        else:
            age_h = (now_dt - stamp).total_seconds() / 3600
            ok = age_h <= fresh.max_age_hours
            reason = (
                ""
                if ok
                else f"{what} is {age_h:.1f} h old, the contract allows {fresh.max_age_hours} h"
            )
            outcomes.append(
                RuleOutcome(
                    "freshness",
                    fresh.column,
                    fresh.severity,
                    ok,
                    reason,
                    observed=stamp.isoformat(),
                )
            )

    for col, rule, ok, reason, share, count, of, samples in profile.outcomes():
        outcomes.append(
            RuleOutcome(
                rule, col.name, col.severity_of(rule), ok, reason, count, of, samples,
                observed=share,
            )
        )  # fmt: skip
    outcomes.extend(drift_problems)
    for i, old in previous.items():
        rule = contract.drift[i]
        value = drift_value(rule, current[i], old)
        ok = bool(value <= rule.max)
        against = f" against snapshot {previous_id}" if previous_id else ""
        reason = "" if ok else f"{rule.method} {value:.4g} > max {rule.max}{against}"
        details: dict[str, Any] = {}
        if old.categorical:
            details["categories"] = category_shares(current[i], old)
        if rule.method == "chi2":
            details.update(chi_square(current[i], old))
            if not ok:
                reason = (
                    f"chi2: Cramér's V {value:.4g} > max {rule.max}{against} (chi2 "
                    f"{details['chi2']:.4g}, {details['dof']:.0f} dof, p {details['p_value']:.2g})"
                )
        outcomes.append(
            RuleOutcome(
                f"drift:{rule.method}",
                rule.column,
                rule.severity,
                ok,
                reason,
                observed=float(value) if np.isfinite(value) else str(value),
                details=details,
            )
        )

    _name_rows(outcomes, opened, contract.roles.key)
    succeeded = sum(1 for r in gx_results if r.success)
    gx_result = ExpectationSuiteValidationResult(
        success=all(r.success for r in gx_results),
        results=gx_results,
        suite_name=full_suite.name,
        statistics={
            "evaluated_expectations": len(gx_results),
            "successful_expectations": succeeded,
            "unsuccessful_expectations": len(gx_results) - succeeded,
            "success_percent": 100.0 * succeeded / len(gx_results) if gx_results else 100.0,
        },
    )
    return RunOutput(
        outcomes, gx_result, rows, batches, time.perf_counter() - start, profile.summary()
    )


def _name_rows(outcomes: list[RuleOutcome], opened: list[pq.ParquetFile], key: str) -> None:
    """Set each failed outcome's ``keys``: the key of each of its sample rows.

    Reads the key column of the files those rows are in, on failure only.
    """
    wanted = sorted({r for o in outcomes if not o.success for r in o.rows})
    if not wanted:
        return
    found: dict[int, Any] = {}
    base = 0
    for pf in opened:
        count = pf.metadata.num_rows
        mine = [r for r in wanted if base <= r < base + count]
        if mine:
            column = pf.read(columns=[key]).column(0)
            found.update((r, column[r - base].as_py()) for r in mine)
        base += count
    for o in outcomes:
        if not o.success and o.rows:
            o.keys = [found.get(r) for r in o.rows]


def _rule_key(meta: dict[str, Any]) -> tuple[str, str | None]:
    """Identifies an expectation of a compiled suite: (rule, column) is unique per suite."""
    return meta["trainyard"]["rule"], meta["trainyard"]["column"]


def _as_utc(value: Any) -> Any:
    import pandas as pd

    stamp = pd.Timestamp(value)
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return stamp.tz_convert("UTC").to_pydatetime()


def _duplicate_samples(
    opened: Sequence[Any], dup_info: dict[str, tuple[np.ndarray, int]], batch_rows: int
) -> dict[str, tuple[list[Any], list[int]]]:
    """First duplicated key values in row order (a second pass, only when there are any)."""
    import numpy as np

    out: dict[str, tuple[list[Any], list[int]]] = {c: ([], []) for c in dup_info}
    todo = {c: dups for c, (dups, n) in dup_info.items() if n}
    if not todo:
        return out
    offset = 0
    for batch, _ in iter_batches(opened, sorted(todo), batch_rows):
        for col, dups in todo.items():
            values, indexes = out[col]
            if len(values) >= SAMPLES:
                continue
            arr = batch.column(col)
            hit = np.flatnonzero(np.isin(_hash_values(arr), dups))[: SAMPLES - len(values)]
            positions = _valid_positions(arr)[hit]
            values.extend(arr.take(positions).to_pylist())
            indexes.extend(int(p) + offset for p in positions)
        offset += batch.num_rows
        if all(len(v) >= SAMPLES for v, _ in out.values()):
            break
    return out
