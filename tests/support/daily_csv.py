"""A dataset the project does not ship, generated in the test: scikit-learn's breast cancer
data as one CSV per day (``<folder>/<YYYY-MM-DD>.csv``), with its contract and pipeline.

569 rows, 30 numeric features, a binary label; day ``i`` of ``n`` gets every ``n``-th row
starting at ``i``, so every day holds both classes and no row is in two days.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path
from typing import Any

import yaml

DATASET = "cancer"
LABEL = "diagnosis"
KEY = "row_id"


def feature_names() -> list[str]:
    """The 30 features as column names (``mean_radius``, ...)."""
    from sklearn.datasets import load_breast_cancer

    return [str(n).replace(" ", "_") for n in load_breast_cancer().feature_names]


def days(first: str, n: int) -> list[str]:
    """``n`` consecutive ISO dates from ``first``."""
    start = dt.date.fromisoformat(first)
    return [(start + dt.timedelta(days=i)).isoformat() for i in range(n)]


def write_days(folder: Path, dates: list[str]) -> dict[str, int]:
    """Write one CSV per date; returns the rows of each."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    names = feature_names()
    folder.mkdir(parents=True, exist_ok=True)
    rows: dict[str, int] = {}
    for i, day in enumerate(dates):
        idx = range(i, len(data.target), len(dates))
        write_csv(
            folder / f"{day}.csv",
            [
                {KEY: f"r{j:04d}", **dict(zip(names, map(float, data.data[j]), strict=True)),
                 LABEL: int(data.target[j])}
                for j in idx
            ],
        )  # fmt: skip
        rows[day] = len(idx)
    return rows


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    """Write records as a CSV (header from the first record)."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV written by :func:`write_csv` (values as text)."""
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def contract(dataset: str = DATASET) -> dict[str, Any]:
    """The dataset's contract: every feature non-negative, the label 0 or 1."""
    names = feature_names()
    return {
        "dataset": dataset,
        "version": "1.0.0",
        "owner": "tests@example.com",
        "source": {"format": "csv", "extension": "csv"},
        "columns": [
            {"name": KEY, "type": "string", "nullable": False, "unique": True},
            *({"name": n, "type": "float64", "nullable": False, "min": 0} for n in names),
            {
                "name": LABEL,
                "type": "int64",
                "nullable": False,
                "allowed_values": [0, 1],
            },
        ],
        "roles": {
            "key": KEY,
            "label": LABEL,
            "features": names,
            "num_classes": 2,
            "class_names": ["malignant", "benign"],  # scikit-learn's target_names
        },
        "rules": {"row_count": {"min": 50}},
        "split": {"holdout_fraction": 0.2, "by": KEY},
    }


def write_contract(folder: Path, dataset: str = DATASET) -> Path:
    """Write ``<folder>/<dataset>.yaml`` (copying the shipped contracts' folder is not needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dataset}.yaml"
    path.write_text(yaml.safe_dump(contract(dataset), sort_keys=False))
    return path


def pipeline(raw: Path, dataset: str = DATASET, **updates: Any) -> dict[str, Any]:
    """A pipeline config (as a dict) reading ``<raw>/{ds}.csv``; ``updates`` merged on top."""
    cfg: dict[str, Any] = {
        "name": dataset,
        "dataset": dataset,
        "schedule": "0 3 * * *",
        "start_date": "2026-10-01",
        "backfill_training": "last",
        "source": {"url": f"{raw}/{{ds}}.csv", "format": "csv"},
        "training": {
            "model": "mlp",
            "workers": 1,
            "epochs": 2,
            "batch_size": 32,
            "learning_rate": 0.01,
            "priority": "low",
            "start_deadline_s": 120,
            "attempt_timeout_s": 300,
            "max_attempts": 1,
        },
        "gate": {"metrics": ["accuracy", "loss"], "thresholds": {"accuracy": {"min": 0.5}}},
        "serving": {"model_name": dataset},
    }
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def use_contracts(env: dict[str, str], folder: Path, dataset: str = DATASET) -> Path:
    """A contracts folder with the shipped contracts and this dataset's; set in ``env``."""
    root = Path(__file__).resolve().parents[2]
    folder.mkdir(parents=True, exist_ok=True)
    for path in (root / "data_contracts").iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    write_contract(folder, dataset)
    env["TRAINYARD_CONTRACTS_DIR"] = str(folder)
    return folder
