"""The Makefile's recipes stop on Ctrl-C: none starts a shell background job.

A recipe runs in a shell without job control, which starts ``cmd &`` with SIGINT ignored:
Ctrl-C ended ``make test`` and left its tool venvs' pip installs running (found by hand,
2026-11-29). Work that runs side by side is make's own (``$(MAKE) -j``), whose jobs Ctrl-C
stops.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a lone `&`: not `&&`, not a redirection (`2>&1`, `&>`), not `|&`
_BACKGROUND = re.compile(r"(?<![&>|])&(?![&>])")


def background_jobs(makefile: str) -> list[str]:
    """The recipe lines of ``makefile`` (continuations joined) that start a background job."""
    lines, current = [], ""
    for raw in makefile.splitlines():
        if current or raw.startswith("\t"):
            current += raw.rstrip("\\").strip() + " "
            if not raw.endswith("\\"):
                lines.append(current.strip())
                current = ""
    unquoted = (re.sub(r"'[^']*'|\"[^\"]*\"", "", line) for line in lines)
    return [line for line, bare in zip(lines, unquoted, strict=True) if _BACKGROUND.search(bare)]


def test_no_recipe_starts_a_background_job() -> None:
    assert background_jobs((ROOT / "Makefile").read_text(encoding="utf-8")) == []


def test_the_check_finds_the_line_that_ignored_ctrl_c() -> None:
    old = (
        "test:\n"
        "\tbash scripts/datacontract_cli.sh & dc=$$!; bash scripts/mlflow_server.sh & mf=$$!; \\\n"
        "\t$(MAKE) $(STAMP) native && mypy; \\\n"
        "\tok=$$?; wait $$dc || ok=1; wait $$mf || ok=1; exit $$ok\n"
        "\tpython -m x > log 2>&1 && echo '&' | cat |& cat &> /dev/null\n"
    )
    found = background_jobs(old)
    assert len(found) == 1 and found[0].startswith("bash scripts/datacontract_cli.sh &")
