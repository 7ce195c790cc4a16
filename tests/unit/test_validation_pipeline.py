"""The validation step end to end: real staging into a real volume, then ``validate``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.support.validation_data import transactions
from trainyard import volumes
from trainyard.config import parse_pipeline
from trainyard.errors import ValidationFailed
from trainyard.staging import stage
from trainyard.validation import validate

PIPELINE = """
name: {name}
dataset: {dataset}
start_date: 2026-11-01
source: {{url: "{url}", format: {fmt}{bootstrap}}}
training: {{model: mlp}}
serving: {{model_name: {name}}}
"""


def _pipeline(tmp_path: Path, dataset: str, url: Path, fmt: str, bootstrap: str = "") -> object:
    path = tmp_path / f"{dataset}.yaml"
    extra = f", bootstrap: {bootstrap}" if bootstrap else ""
    path.write_text(
        PIPELINE.format(name=dataset, dataset=dataset, url=url, fmt=fmt, bootstrap=extra)
    )
    return parse_pipeline(path)


def _write_csv(path: Path, cols: dict[str, list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(list(cols))
        writer.writerows(zip(*cols.values(), strict=True))


def test_transactions_validate_then_reject_drift(volume_root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "txn.csv"
    _write_csv(raw, transactions(3000, seed=1))
    pipeline = _pipeline(tmp_path, "transactions", raw, "csv")
    first = stage(pipeline, quiet=True)
    result = validate(pipeline, first.snapshot_id)
    assert result.success and result.rows == 3000
    assert volumes.latest_validated("transactions") == first.snapshot_id
    assert (first.path / "validation" / "data_docs" / "index.html").is_file()
    record = json.loads((volume_root / "transactions" / "validated.json").read_text())
    assert record["history"][-1]["summary"]["rows"] == 3000
    assert list((volume_root / "transactions" / ".tmp").iterdir()) == []

    _write_csv(raw, transactions(3000, seed=2, amount_shift=40.0))
    second = stage(pipeline, quiet=True)
    assert second.snapshot_id != first.snapshot_id
    with pytest.raises(ValidationFailed, match=f"against snapshot {first.snapshot_id}"):
        validate(pipeline, second.snapshot_id)
    assert volumes.latest_validated("transactions") == first.snapshot_id
    rejected = json.loads((second.path / "validation" / "rejected.json").read_text())
    assert {(f["rule"], f["column"]) for f in rejected["failures"]} == {
        ("drift:mean_shift", "amount"),
        ("drift:ks", "amount"),
    }
    assert rejected["previous_snapshot_id"] == first.snapshot_id


def test_digits_bootstrap_snapshot_is_valid(volume_root: Path, tmp_path: Path) -> None:
    pipeline = _pipeline(
        tmp_path, "digits", tmp_path / "raw" / "digits", "image_folder", "sklearn_digits"
    )
    staged = stage(pipeline, quiet=True)
    result = validate(pipeline, staged.snapshot_id)
    assert result.success, result.table
    assert result.rows == staged.rows
    assert volumes.latest_validated("digits") == staged.snapshot_id
