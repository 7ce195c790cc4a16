"""Benchmark: batched contract validation vs a plain whole-frame GX pandas validation.

Both sides start from the same generated ``transactions`` snapshot on disk (Parquet shards)
and run the same compiled suite (``build_suite`` of ``data_contracts/transactions.yaml``):

* ours: ``trainyard.validation.runner.run_contract``: pyarrow batches of ``--batch-rows``,
  GX per batch, dataset-level uniqueness / row count / class presence across batches;
* baseline: read every shard with pyarrow, ``to_pandas()`` the whole table, one GX
  ``batch.validate(suite)`` on it.

Each runs in its own child process so its peak RSS (``ru_maxrss``) is its own; the timer
starts after the imports. The parent checks that both report the same unexpected counts.

    python benchmarks/validation.py --rows 2000000        # default size, a few minutes
    python benchmarks/validation.py --rows 10000000

Last line: ``BENCH validation ratio=<ours/baseline rows/s> ours=<rows/s> baseline=<rows/s>
peak_rss_mb=<ours>/<baseline> ...``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

CATEGORIES = ["grocery", "fuel", "travel", "dining", "electronics", "fashion", "health", "online"]
SHARD_ROWS = 1_000_000


def generate(folder: Path, rows: int, seed: int = 0) -> list[Path]:
    """Write a transactions snapshot of ``rows`` rows (a few deliberate violations)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    cats = pa.array([*CATEGORIES, "casino"])
    for k, start in enumerate(range(0, rows, SHARD_ROWS)):
        n = min(SHARD_ROWS, rows - start)
        ids = pc.cast(pa.array(np.arange(start, start + n)), pa.string())
        txn = pc.binary_join_element_wise("t", ids, "")
        cat_idx = rng.integers(0, 8, n)
        cat_idx[rng.random(n) < 1e-4] = 8
        table = pa.table(
            {
                "txn_id": txn,
                "amount": rng.gamma(2.0, 30.0, n) + 0.5,
                "hour": rng.integers(0, 24, n),
                "merchant_category": cats.take(pa.array(cat_idx)),
                "customer_age": rng.integers(18, 91, n),
                "is_fraud": (rng.random(n) < 0.05).astype(np.int64),
            }
        )
        path = folder / f"part-{k:05d}.parquet"
        pq.write_table(table, path, row_group_size=131_072)
        files.append(path)
    return files


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _counts(results: list) -> dict[str, list]:
    from trainyard.validation.suite import rule_meta

    out = {}
    for r in results:
        meta = rule_meta(r.expectation_config)
        count = r.result.get("unexpected_count")
        if meta["rule"] == "row_count":
            count = r.result.get("observed_value")
        out[f"{meta['rule']}:{meta['column']}"] = [bool(r.success), count]
    return out


def child(side: str, folder: Path, batch_rows: int, repeat: int) -> None:
    import great_expectations as gx
    import pandas as pd  # noqa: F401
    import pyarrow.parquet as pq

    from trainyard.contracts import parse_contract
    from trainyard.validation.runner import run_contract
    from trainyard.validation.suite import build_suite

    contract = parse_contract(ROOT / "data_contracts" / "transactions.yaml")
    files = sorted(folder.glob("part-*.parquet"))
    import_rss = _peak_rss_mb()
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu_start = time.perf_counter(), time.process_time()
        if side == "ours":
            with tempfile.TemporaryDirectory(dir=folder) as work:
                run = run_contract(contract, files, batch_rows=batch_rows, work_dir=Path(work))
            rows, results = run.rows, run.gx_result.results
        else:
            import pyarrow as pa
            from great_expectations.data_context.types.base import ProgressBarsConfig

            df = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            asset = context.data_sources.add_pandas("whole").add_dataframe_asset("frame")
            batch = asset.add_batch_definition_whole_dataframe("all").get_batch(
                batch_parameters={"dataframe": df}
            )
            result = batch.validate(build_suite(contract), result_format="SUMMARY")
            rows, results = len(df), result.results
            del df, batch, result
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
    seconds, cpu_seconds = min(walls), min(cpus)
    print(
        json.dumps(
            {
                "side": side,
                "rows": rows,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss_mb": _peak_rss_mb(),
                "rss_after_imports_mb": import_rss,
                "counts": _counts(results),
            }
        )
    )


def run_child(side: str, folder: Path, batch_rows: int, repeat: int) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            side,
            "--dir",
            str(folder),
            "--batch-rows",
            str(batch_rows),
            "--repeat",
            str(repeat),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{side} child failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-rows", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs per side; best time counts")
    parser.add_argument("--dir", type=Path, help="snapshot folder (generated if absent)")
    parser.add_argument("--child", choices=["ours", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.dir, args.batch_rows, args.repeat)
        return
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        folder = args.dir or Path(tmp) / "snapshot"
        if not list(folder.glob("part-*.parquet")):
            t = time.perf_counter()
            generate(folder, args.rows)
            print(f"generated {args.rows} rows in {time.perf_counter() - t:.1f}s at {folder}")
        ours = run_child("ours", folder, args.batch_rows, args.repeat)
        base = run_child("baseline", folder, args.batch_rows, args.repeat)
    for r in (ours, base):
        print(
            f"{r['side']:9s} rows={r['rows']} seconds={r['seconds']:.2f} "
            f"rows/s={r['rows'] / r['seconds']:.0f} cpu_seconds={r['cpu_seconds']:.2f} "
            f"rows/cpu_s={r['rows'] / r['cpu_seconds']:.0f} peak_rss_mb={r['peak_rss_mb']:.0f} "
            f"(after imports {r['rss_after_imports_mb']:.0f})"
        )
    agree = ours["counts"] == base["counts"] and ours["rows"] == base["rows"]
    if not agree:
        print(f"MISMATCH ours={ours['counts']} baseline={base['counts']}")
    ours_rps = ours["rows"] / ours["seconds"]
    base_rps = base["rows"] / base["seconds"]
    cpu_ratio = base["cpu_seconds"] / ours["cpu_seconds"]
    print(
        f"BENCH validation ratio={ours_rps / base_rps:.3f} ours={ours_rps:.0f} "
        f"baseline={base_rps:.0f} peak_rss_mb={ours['peak_rss_mb']:.0f}/{base['peak_rss_mb']:.0f} "
        f"cpu_ratio={cpu_ratio:.3f} rows={ours['rows']} batch_rows={args.batch_rows} "
        f"results_agree={'yes' if agree else 'no'}"
    )


if __name__ == "__main__":
    main()
