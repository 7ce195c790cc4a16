"""The batched run must equal one GX run over the whole frame on the same data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.support.validation_data import transactions, write_snapshot
from trainyard.contracts import load_contract
from trainyard.validation.runner import run_contract
from trainyard.validation.suite import build_suite, rule_meta

CONTRACT = load_contract("transactions")


def _dirty(n: int = 3000) -> dict[str, list]:
    cols = transactions(n, seed=7)
    for row in (10, 1500, 2990):
        cols["amount"][row] = None
    cols["amount"][11] = -3.0
    for row in (5, 2000, 2001):
        cols["hour"][row] = 30
    cols["hour"][42] = None
    for row in range(100, 3000, 97):
        cols["merchant_category"][row] = "casino"
    cols["txn_id"][2800] = cols["txn_id"][3]
    cols["txn_id"][1200] = cols["txn_id"][50]
    cols["txn_id"][1201] = cols["txn_id"][50]
    cols["txn_id"][700] = "bad id"
    cols["customer_age"][2222] = 99
    return cols


def _whole_frame(files: list[Path]) -> dict[tuple[str, str | None], Any]:
    import great_expectations as gx
    import pyarrow as pa

    df = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
    context = gx.get_context(mode="ephemeral")
    asset = context.data_sources.add_pandas("whole").add_dataframe_asset("frame")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(
        batch_parameters={"dataframe": df}
    )
    result = batch.validate(build_suite(CONTRACT), result_format="SUMMARY")
    out = {}
    for r in result.results:
        meta = rule_meta(r.expectation_config)
        out[(meta["rule"], meta["column"])] = r
    return out


@pytest.fixture(scope="module")
def dirty_snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    snap = tmp_path_factory.mktemp("dirty")
    return snap, write_snapshot(snap, _dirty(), shards=3)


@pytest.fixture(scope="module")
def whole(dirty_snapshot: tuple[Path, list[Path]]) -> dict[tuple[str, str | None], Any]:
    return _whole_frame(dirty_snapshot[1])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)


MAP_KEYS = ("element_count", "unexpected_count", "missing_count", "partial_unexpected_list")


@pytest.mark.parametrize("batch_rows", [333, 1000, 1_000_000], ids=["many", "some", "per-shard"])
def test_batched_equals_whole_frame(
    dirty_snapshot: tuple[Path, list[Path]], whole: dict, batch_rows: int, tmp_path: Path
) -> None:
    _, files = dirty_snapshot
    run = run_contract(CONTRACT, files, batch_rows=batch_rows, work_dir=tmp_path)
    assert run.rows == 3000
    ours = {}
    for r in run.gx_result.results:
        meta = rule_meta(r.expectation_config)
        ours[(meta["rule"], meta["column"])] = r
    assert ours.keys() == whole.keys()
    failing = set()
    for key, theirs in whole.items():
        mine = ours[key]
        assert mine.success == theirs.success, key
        if not theirs.success:
            failing.add(key)
        if "unexpected_count" in theirs.result:
            for field in MAP_KEYS:
                if field not in theirs.result:
                    assert field not in mine.result, (key, field)
                    continue
                assert _same(mine.result[field], theirs.result[field]), (key, field)
            assert mine.result["unexpected_percent"] == pytest.approx(
                theirs.result["unexpected_percent"]
            )
        elif key[0] == "row_count":
            assert mine.result["observed_value"] == theirs.result["observed_value"] == 3000
    assert failing == {
        ("nullable", "amount"),
        ("range", "amount"),
        ("nullable", "hour"),
        ("range", "hour"),
        ("allowed_values", "merchant_category"),
        ("unique", "txn_id"),
        ("regex", "txn_id"),
        ("max", "customer_age"),
    }
    outcome = {(o.rule, o.column): o for o in run.outcomes}
    assert outcome[("unique", "txn_id")].unexpected_count == 5
    assert outcome[("range", "hour")].samples == [30, 30, 30]
    assert outcome[("max", "customer_age")].severity == "warn"


def test_long_validation_logs_rows_batches_and_eta(
    dirty_snapshot: tuple[Path, list[Path]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINYARD_PROGRESS_S", "0")
    run_contract(CONTRACT, dirty_snapshot[1], batch_rows=1000, work_dir=tmp_path)
    lines = [
        ln
        for ln in capsys.readouterr().err.splitlines()
        if ln.startswith("validating transactions:")
    ]
    assert lines, "no progress line with TRAINYARD_PROGRESS_S=0"
    assert lines[-1].startswith("validating transactions: 3,000/3,000 rows (100.0%), 3 batches, ")
    assert all("rows/s" in ln and "ETA" in ln for ln in lines)
