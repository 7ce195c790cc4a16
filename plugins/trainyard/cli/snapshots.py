"""``python -m trainyard snapshots list|show|verify|mirror|gc``."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from trainyard import argtypes
from trainyard.errors import SnapshotError
from trainyard.fsutil import (
    redact_url,
)
from trainyard.volumes.integrity import (
    clean_stale_tmp,
    mirror_snapshot,
    recorded_damage,
    verify_snapshot,
)
from trainyard.volumes.maintenance import active_leases, gc_snapshots
from trainyard.volumes.manifest import list_datasets, list_snapshots, read_manifest
from trainyard.volumes.paths import snapshot_dir
from trainyard.volumes.pointers import (
    latest_validated,
    refused_intervals,
    replaced_snapshots,
    validation_state,
)

log = logging.getLogger("trainyard.cli")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _cli_list(args: argparse.Namespace) -> int:
    datasets = [args.dataset] if args.dataset else list_datasets()
    if args.dataset and args.dataset not in list_datasets():
        from trainyard.contracts import contract_files

        contracts = [p.stem for p in contract_files()]
        if args.dataset not in contracts:
            known = sorted({*list_datasets(), *contracts})
            raise SnapshotError(
                f"unknown dataset {args.dataset!r}: no data contract and no volume "
                f"(known: {', '.join(known) or 'none'})"
            )
        print(f"{args.dataset}: no snapshots yet (stage one with its pipeline)")
        return 0
    head = f"{'dataset':<16} {'snapshot':<16} {'kind':<5} {'rows':>10} {'size':>10}"
    print(f"{head}  created / interval / validation")
    for ds in datasets:
        validated = latest_validated(ds)
        refused = refused_intervals(ds)
        replaced = replaced_snapshots(ds)
        for m in list_snapshots(ds):
            mark = " *last validated" if m.snapshot_id == validated else ""
            if (by := replaced.get(m.snapshot_id)) is not None:
                mark += f" REPLACED by {by['by']} at {by['at']} (its interval points there now)"
            for r in refused.get(m.snapshot_id, []):
                mark += (
                    f" SUPERSEDED: [{r.get('start')} .. {r.get('end')})'s source was refused "
                    f"at {r['refused'].get('at')} ({r['refused'].get('reason')}); left out "
                    "until it stages"
                )
            state = validation_state(snapshot_dir(ds, m.snapshot_id))
            if state["state"] == "rejected":
                mark += f" REJECTED: {state['reason']}"
            elif state["state"] == "not validated":
                mark += " (not validated)"
            damage = recorded_damage(snapshot_dir(ds, m.snapshot_id))
            if damage is not None:
                mark += f" DAMAGED: {damage['reason']} (staging its interval replaces it)"
            iv = f"  [{m.interval['start']} .. {m.interval['end']})" if m.interval else ""
            print(
                f"{ds:<16} {m.snapshot_id:<16} {m.kind:<5} {m.rows:>10} "
                f"{_fmt_bytes(m.bytes):>10}  {m.created_at}{iv}{mark}"
            )
    return 0


def _cli_show(args: argparse.Namespace) -> int:
    snap = snapshot_dir(args.dataset, args.snapshot_id)
    shown = read_manifest(snap).to_dict()
    if isinstance(shown["source"].get("url"), str):
        # manifests written before URLs were redacted at staging
        shown["source"]["url"] = redact_url(shown["source"]["url"])
    shown["validation"] = validation_state(snap)
    shown["damaged"] = recorded_damage(snap)
    print(json.dumps(shown, indent=2))
    return 0


def _cli_verify(args: argparse.Namespace) -> int:
    ids = args.snapshot_id or [m.snapshot_id for m in list_snapshots(args.dataset)]
    bad = 0
    for sid in ids:
        problems = verify_snapshot(snapshot_dir(args.dataset, sid))
        if problems:
            bad += 1
            for p in problems:
                print(f"{args.dataset}/{sid}: {p}")
        else:
            print(f"{args.dataset}/{sid}: ok")
    return 1 if bad else 0


def _cli_mirror(args: argparse.Namespace) -> int:
    where = mirror_snapshot(args.dataset, args.snapshot_id, args.target)
    print(f"{args.dataset}/{args.snapshot_id}: mirrored and verified at {where}")
    return 0


def _cli_gc(args: argparse.Namespace) -> int:
    keep = args.keep
    if keep is None:
        from trainyard.config import load_pipeline

        keep = load_pipeline(args.pipeline).staging.retention if args.pipeline else 7
    removed = clean_stale_tmp(args.dataset)
    doomed = gc_snapshots(args.dataset, keep, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{args.dataset}: kept newest {keep}, {verb} {len(doomed)}: {', '.join(doomed) or '-'}"
        f"; removed {len(removed)} stale temp entries"
    )
    for sid, leases in sorted(active_leases(args.dataset).items()):
        holders = ", ".join(
            f"{r.get('purpose')} (pid {r.get('pid')} on {r.get('host')})" for r in leases
        )
        print(f"{args.dataset}/{sid}: leased by {holders}")
    return 0


def cli_main(argv: list[str]) -> int:
    """``trainyard snapshots list|show|verify|mirror|gc``.

    Args:
        argv: Arguments after ``snapshots``.

    Returns:
        0 on success, 1 if ``verify`` found a damaged snapshot.
    """
    parser = argtypes.ArgumentParser(prog="trainyard snapshots")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="list snapshots (of one dataset or all)")
    p.add_argument("dataset", nargs="?")
    p.set_defaults(fn=_cli_list)
    p = sub.add_parser("show", help="print a snapshot's manifest")
    p.add_argument("dataset")
    p.add_argument("snapshot_id")
    p.set_defaults(fn=_cli_show)
    p = sub.add_parser("verify", help="re-hash shards against the manifest")
    p.add_argument("dataset")
    p.add_argument("snapshot_id", nargs="*", help="default: every snapshot of the dataset")
    p.set_defaults(fn=_cli_verify)
    p = sub.add_parser("mirror", help="copy a snapshot to another volume root or URL, verify")
    p.add_argument("dataset")
    p.add_argument("snapshot_id")
    p.add_argument("target", help="a directory (volume root) or an fsspec URL")
    p.set_defaults(fn=_cli_mirror)
    p = sub.add_parser("gc", help="apply retention and remove stale temp entries")
    p.add_argument("dataset")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--keep", type=int, help="newest snapshots to keep")
    group.add_argument("--pipeline", help="take the retention from this pipeline's config")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(fn=_cli_gc)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except BrokenPipeError:
        sys.stderr.close()
        return 0
