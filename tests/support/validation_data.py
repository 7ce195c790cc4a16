"""Builders of small transactions snapshots for the validation tests (real Parquet files)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CATEGORIES = ["grocery", "fuel", "travel", "dining", "electronics", "fashion", "health", "online"]


def transactions(n: int = 2000, seed: int = 0, amount_shift: float = 0.0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    fraud = (rng.random(n) < 0.1).astype(np.int64)
    fraud[:2] = [0, 1]
    return {
        "txn_id": [f"t{seed}_{i:06d}" for i in range(n)],
        "amount": (rng.gamma(2.0, 30.0, n) + 0.5 + amount_shift).tolist(),
        "hour": rng.integers(0, 24, n).tolist(),
        "merchant_category": rng.choice(CATEGORIES, n).tolist(),
        "customer_age": rng.integers(18, 91, n).tolist(),
        "is_fraud": fraud.tolist(),
    }


SCHEMA = pa.schema(
    [
        ("txn_id", pa.string()),
        ("amount", pa.float64()),
        ("hour", pa.int64()),
        ("merchant_category", pa.string()),
        ("customer_age", pa.int64()),
        ("is_fraud", pa.int64()),
    ]
)


def write_snapshot(
    snapshot_dir: Path,
    cols: dict[str, list],
    shards: int = 2,
    schema: pa.Schema | None = SCHEMA,
) -> list[Path]:
    """Write ``cols`` as ``part-0000k.parquet`` shards; returns the files."""
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    table = pa.table(cols, schema=schema) if schema is not None else pa.table(cols)
    n = table.num_rows
    step = -(-n // shards) if n else 1
    files = []
    for k in range(shards):
        path = snapshot_dir / f"part-{k:05d}.parquet"
        pq.write_table(table.slice(k * step, step), path, row_group_size=700)
        files.append(path)
    return files


Mutation = Callable[[dict[str, list]], None]


def setter(column: str, row: int, value: object) -> Mutation:
    def apply(cols: dict[str, list]) -> None:
        cols[column][row] = value

    return apply
