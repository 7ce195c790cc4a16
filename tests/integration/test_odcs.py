"""Data contracts to ODCS v3.2.0 and back: checked by ODCS's own JSON schema, round-tripped."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainyard.cli.contracts import export_contract
from trainyard.contracts import parse_contract, parse_contract_text
from trainyard.errors import ContractError
from trainyard.odcs import check_odcs, from_odcs

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "contracts" / "positive"
CONTRACTS = [
    *sorted((ROOT / "data_contracts").glob("*.yaml")),
    *sorted(FIXTURES.glob("*.yaml")),
]


def _same(a: object, b: object) -> bool:
    return dataclasses.replace(a, path=None) == dataclasses.replace(b, path=None)  # type: ignore[type-var]


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_export_is_valid_odcs_and_import_gives_the_same_contract(
    path: Path, tmp_path: Path
) -> None:
    doc = export_contract(path)
    check_odcs(doc, path.stem)  # ODCS's own JSON schema (open-data-contract-standard)
    assert doc["apiVersion"] == "v3.2.0" and doc["kind"] == "DataContract"
    raw = from_odcs(yaml.safe_load(yaml.safe_dump(doc)), "exported")
    back = tmp_path / f"{raw['dataset']}.yaml"
    back.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert _same(parse_contract(back), parse_contract(path))


def test_native_odcs_fields_carry_what_odcs_can_say() -> None:
    doc = export_contract(FIXTURES / "full.yaml")
    props = {p["name"]: p for p in doc["schema"][0]["properties"]}
    assert props["id"]["primaryKey"] is True and props["id"]["required"] is True
    assert props["id"]["logicalTypeOptions"] == {"pattern": "^[a-z0-9]+$", "minLength": 1,
                                                 "maxLength": 32}  # fmt: skip
    assert props["x"]["logicalTypeOptions"] == {"exclusiveMinimum": 0, "maximum": 100}
    assert props["y"]["enum"] == [{"value": 0}, {"value": 1}]
    assert props["ts"]["logicalType"] == "timestamp"
    assert doc["schema"][0]["quality"] == [
        {"metric": "rowCount", "type": "library", "mustBeBetween": [1, 1000], "severity": "error"}
    ]
    assert doc["team"] == {"members": [{"username": "data@example.com", "role": "owner"}]}
    custom = {c["property"]: c for c in doc["customProperties"]}
    assert set(custom) >= {"roles", "split", "source", "drift", "rules"}
    assert {c["vendor"] for c in custom.values()} == {"trainyard"}


def _odcs(**changes: object) -> dict:
    doc = export_contract(ROOT / "data_contracts" / "transactions.yaml")
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_odcs(apiVersion="v9"), r"apiVersion: 'v9' is not one of"),
        (_odcs(customProperties=[]), "no trainyard roles, split, source"),
        (_odcs(schema=[]), "has 0 schema objects"),
        (_odcs(kind="Table"), "kind: 'Table' is not one of"),
    ],
    ids=["api-version", "foreign-contract", "no-table", "kind"],
)
def test_an_odcs_file_trainyard_cannot_use_is_one_clear_error(doc: dict, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        from_odcs(doc, "in.odcs.yaml")


def test_a_property_type_trainyard_has_no_column_for_names_it() -> None:
    doc = _odcs()
    doc["schema"][0]["properties"].append({"name": "tags", "logicalType": "array"})
    with pytest.raises(ContractError, match="property 'tags': logicalType 'array'"):
        from_odcs(doc, "in.odcs.yaml")


def test_the_imported_contract_is_checked_like_any_other(tmp_path: Path) -> None:
    doc = _odcs()
    roles = next(c for c in doc["customProperties"] if c["property"] == "roles")
    roles["value"] = {**roles["value"], "label": "no_such_column"}
    raw = from_odcs(doc, "in.odcs.yaml")
    with pytest.raises(ContractError, match="no_such_column"):
        parse_contract_text(yaml.safe_dump(raw), tmp_path / "transactions.yaml")


def test_cli_export_then_import_round_trips_and_refuses_to_overwrite(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trainyard", "contracts", *args],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    out = cli("export", "--format", "odcs", "--output-dir", str(tmp_path / "odcs"))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "odcs").iterdir()) == [
        "churn.odcs.yaml",
        "digits.odcs.yaml",
        "transactions.odcs.yaml",
    ]
    dest = tmp_path / "contracts"
    done = cli("import", str(tmp_path / "odcs" / "digits.odcs.yaml"), "--output-dir", str(dest))
    assert done.returncode == 0, done.stderr
    assert _same(
        parse_contract(dest / "digits.yaml"),
        parse_contract(ROOT / "data_contracts" / "digits.yaml"),
    )
    again = cli("import", str(tmp_path / "odcs" / "digits.odcs.yaml"), "--output-dir", str(dest))
    assert again.returncode != 0 and "exists: pass --force" in again.stderr
    unknown = cli("export", "nope", "--format", "odcs")
    assert unknown.returncode != 0 and "no contract 'nope'" in unknown.stderr
    assert "known: churn, digits, transactions" in unknown.stderr
    one = cli("export", "transactions", "--format", "odcs")
    assert yaml.safe_load(one.stdout)["name"] == "transactions"


DATACONTRACT = ROOT / ".trainyard" / "tools" / "datacontract" / "bin" / "datacontract"


@pytest.mark.skipif(
    not DATACONTRACT.exists(), reason="datacontract-cli not installed: scripts/datacontract_cli.sh"
)
def test_datacontract_cli_lint_accepts_every_export_and_refuses_a_broken_one(
    tmp_path: Path,
) -> None:
    for path in CONTRACTS:
        out = tmp_path / f"{path.stem}.odcs.yaml"
        out.write_text(yaml.safe_dump(export_contract(path), sort_keys=False))
        lint = subprocess.run([str(DATACONTRACT), "lint", str(out)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert lint.returncode == 0, lint.stdout + lint.stderr
        assert "valid against ODCS v3.2.0" in lint.stdout.replace("\n", " ")
    broken = yaml.safe_load(out.read_text())
    broken["schema"][0]["properties"][0]["required"] = "yes"
    out.write_text(yaml.safe_dump(broken))
    lint = subprocess.run([str(DATACONTRACT), "lint", str(out)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert lint.returncode == 1 and "'yes' is not of type" in lint.stdout
