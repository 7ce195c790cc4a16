"""Validation reports next to the snapshot: ``<snapshot>/validation/``.

* ``summary.json``: every rule's outcome, counts and samples, drift figures, timings.
* ``data_docs/index.html``: GX Data Docs page of the merged suite result.
* ``rejected.json``: present only when a blocking rule failed.

The folder is written privately and swapped into place, so readers see the previous
report or the new one, never a mix.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.fsutil import atomic_write_bytes, atomic_write_json, fsync_dir, fsync_tree

if TYPE_CHECKING:
    from trainyard.validation.runner import RuleOutcome

STALE_TMP_S = 3600
SAMPLE_COLUMNS = 3
SAMPLE_WIDTH = 48


def _status(outcome: RuleOutcome) -> str:
    if outcome.success:
        return "ok"
    return "FAIL" if outcome.severity == "error" else "warn"


def render_table(outcomes: Sequence[RuleOutcome]) -> str:
    """A short fixed-width table for task logs: status, rule, column, unexpected, samples.

    Args:
        outcomes: Rule outcomes of one run.

    Returns:
        The table as text (failures first, then warnings, then passing rules).
    """
    order = {"FAIL": 0, "warn": 1, "ok": 2}
    rows = [("status", "rule", "column", "unexpected", "samples / reason")]
    for o in sorted(outcomes, key=lambda o: order[_status(o)]):
        samples = ", ".join(repr(v) for v in o.samples[:SAMPLE_COLUMNS])
        detail = samples if samples else o.reason
        if samples and o.reason:
            detail = f"{samples}  ({o.reason})"
        if len(detail) > SAMPLE_WIDTH * 2:
            detail = detail[: SAMPLE_WIDTH * 2 - 3] + "..."
        unexpected = "" if o.unexpected_count is None else str(o.unexpected_count)
        rows.append((_status(o), o.rule, o.column or "-", unexpected, detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:4])) + "  " + r[4] for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


_SITE_LINK = re.compile(r'\s(href|src)="(?:\.\./)+[^"]*"')
"""A link into a Data Docs *site* (its index, suite pages, static files): this page is one
validation result on its own, so each would be a 404."""

_OFFLINE_CSS = (
    "<style>body{font:14px/1.45 system-ui,sans-serif;margin:16px}"
    "table{border-collapse:collapse}td,th{border:1px solid #d1d5db;padding:3px 8px;"
    "text-align:left;vertical-align:top}</style>"
)
"""Readable tables before GX's CDN stylesheets load (or where they cannot: no internet)."""


def render_data_docs(gx_result: Any) -> str:
    """Render a suite validation result as one GX Data Docs HTML page.

    GX renders it for a Data Docs site; alone, its links to the site's index and suite
    pages are dead, so they are made plain text, and a small inline stylesheet keeps its
    tables readable where GX's CDN stylesheets do not load.
    """
    from great_expectations.render.renderer import ValidationResultsPageRenderer
    from great_expectations.render.view import DefaultJinjaPageView

    document = ValidationResultsPageRenderer().render(gx_result)
    page = _SITE_LINK.sub("", DefaultJinjaPageView().render(document))
    return page.replace("<head>", "<head>" + _OFFLINE_CSS, 1)


def write_report(
    snapshot_dir: Path, summary: dict[str, Any], gx_result: Any | None, *, rejected: bool
) -> Path:
    """Write the report folder and swap it into ``<snapshot>/validation``.

    Args:
        snapshot_dir: The snapshot being validated.
        summary: The JSON summary (also the body of ``rejected.json`` when rejected).
        gx_result: The merged GX suite result (None when the schema check stopped the run).
        rejected: Whether a blocking rule failed.

    Returns:
        The report folder.
    """
    final = snapshot_dir / "validation"
    for residue in snapshot_dir.glob(".validation-*"):
        if time.time() - residue.lstat().st_mtime > STALE_TMP_S:
            shutil.rmtree(residue, ignore_errors=True)
    tmp = snapshot_dir / f".validation-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        atomic_write_json(tmp / "summary.json", summary)
        if gx_result is not None:
            html = render_data_docs(gx_result)
            atomic_write_bytes(tmp / "data_docs" / "index.html", html.encode("utf-8"))
            atomic_write_json(tmp / "data_docs" / "suite_result.json", gx_result.to_json_dict())
        if rejected:
            atomic_write_json(tmp / "rejected.json", summary)
        fsync_tree(tmp)
        old = None
        if final.exists():
            old = snapshot_dir / f".validation-old-{uuid.uuid4().hex[:12]}"
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(snapshot_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
