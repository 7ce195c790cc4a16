"""``python -m trainyard contracts check|export|import``: check contracts; ODCS both ways.

The contract parser (:mod:`trainyard.contracts`) and the ODCS translation
(:mod:`trainyard.odcs`, pure dicts) meet here, so neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from trainyard import argtypes
from trainyard.contracts import contract_files, parse_contract, parse_contract_text
from trainyard.errors import ContractError
from trainyard.fsutil import check_files, load_yaml
from trainyard.odcs import check_odcs, from_odcs, to_odcs
from trainyard.settings import get_settings


def export_contract(path: Path) -> dict[str, Any]:
    """Parse and check a contract file, then translate it (``contracts export``)."""
    parse_contract(path)
    return to_odcs(load_yaml(path.read_text(encoding="utf-8"), path))


def import_contract(path: Path) -> tuple[str, str]:
    """Translate an ODCS file into a checked contract (``contracts import``).

    Returns:
        The dataset and the contract's YAML text.

    Raises:
        ContractError: For a file ODCS or trainyard's contract checks refuse.
    """
    doc = load_yaml(path.read_text(encoding="utf-8"), path)
    if not isinstance(doc, dict):
        raise ContractError(f"{path}: not an ODCS document (a YAML mapping)")
    raw = from_odcs(doc, str(path))
    text = (
        f"# Imported from {path.name} (ODCS {doc.get('apiVersion')}) by trainyard contracts "
        "import.\n" + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    )
    parse_contract_text(text, path.with_name(f"{raw['dataset']}.yaml"))
    return str(raw["dataset"]), text


def cli_main(argv: list[str]) -> int:
    """``trainyard contracts check|export|import``: check contracts; translate them to ODCS.

    Args:
        argv: Arguments after ``contracts``.

    Returns:
        0 if every contract is valid (or translated), 1 if any is invalid, 2 on usage errors.
    """
    parser = argtypes.ArgumentParser(prog="python -m trainyard contracts")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check contracts (default: every contract)")
    check.add_argument("files", nargs="*", type=Path)
    export = sub.add_parser(
        "export", help="write contracts as Open Data Contract Standard (ODCS v3.2.0) YAML"
    )
    export.add_argument("datasets", nargs="*", help="default: every contract")
    export.add_argument("--format", choices=["odcs"], required=True)
    export.add_argument(
        "--output-dir", type=Path, help="write <dataset>.odcs.yaml there (default: stdout)"
    )
    imp = sub.add_parser("import", help="write an ODCS contract as a trainyard contract")
    imp.add_argument("file", type=Path)
    imp.add_argument(
        "--output-dir", type=Path, help="where to write <dataset>.yaml (default: the contracts)"
    )
    imp.add_argument("--force", action="store_true", help="replace an existing contract")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.command == "export":
        return _export(args.datasets, args.output_dir)
    if args.command == "import":
        return _import(args.file, args.output_dir, args.force)
    files = args.files or contract_files()
    if not files:
        sys.stderr.write(f"no contracts found in {get_settings().contracts_dir}\n")
        return 1
    return check_files(
        files, parse_contract, lambda c: f"{c.dataset} {c.version}", ContractError, "contract"
    )


def _export(datasets: list[str], output_dir: Path | None) -> int:
    folder = get_settings().contracts_dir
    files = [folder / f"{d}.yaml" for d in datasets] if datasets else contract_files()
    for path in files:
        if not path.is_file():
            known = ", ".join(p.stem for p in contract_files()) or "none"
            raise ContractError(f"no contract {path.stem!r} in {folder} (known: {known})")
        doc = export_contract(path)
        check_odcs(doc, f"{path.stem} exported")  # what trainyard writes, ODCS accepts
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        if output_dir is None:
            sys.stdout.write(("---\n" if len(files) > 1 else "") + text)
        else:
            from trainyard.fsutil import atomic_write_bytes

            output_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(output_dir / f"{path.stem}.odcs.yaml", text.encode())
            sys.stderr.write(f"wrote {output_dir / f'{path.stem}.odcs.yaml'}\n")
    return 0


def _import(file: Path, output_dir: Path | None, force: bool) -> int:
    from trainyard.fsutil import atomic_write_bytes

    if not file.is_file():
        raise ContractError(f"{file}: no such file")
    dataset, text = import_contract(file)
    target = (output_dir or get_settings().contracts_dir) / f"{dataset}.yaml"
    if target.exists() and not force:
        raise ContractError(f"{target} exists: pass --force to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, text.encode())
    sys.stderr.write(f"wrote {target} (contract of dataset {dataset!r})\n")
    return 0
