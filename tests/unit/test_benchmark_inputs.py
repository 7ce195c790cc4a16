"""The benchmarks' own inputs stay valid as the code moves on (they are not run by the suite).

Found when re-measuring: after the class count became required, both staging benchmarks
stopped at their contract.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trainyard.contracts import parse_contract_text

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["staging_csv", "staging_files"])
def test_benchmark_contracts_are_valid_contracts(name: str, tmp_path: Path) -> None:
    text = _module(name).CONTRACT
    dataset = text.split("dataset:", 1)[1].split()[0]
    parse_contract_text(text, tmp_path / f"{dataset}.yaml")
