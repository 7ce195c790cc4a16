"""Everything trainyard writes on a laptop is its owner's only, read as another account.

Airflow's generated admin password file was 0644 in a 0755 folder, and task logs, the
registry and the shards were world-readable: every local account could read them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def _as_nobody(path: Path) -> int:
    """0 if uid 65534 can read ``path``, 1 if it is refused."""
    code = f"open({str(path)!r}, 'rb').read(1)"

    def drop() -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    run = subprocess.run(["/usr/bin/python3", "-c", code], preexec_fn=drop, capture_output=True)
    return 0 if run.returncode == 0 else 1


def test_the_projects_environment_is_owner_only() -> None:
    out = subprocess.run(
        ["bash", "-c", ". scripts/env.sh && umask && stat -c %a .trainyard && "
         "python -c \"open('.trainyard/owner_only_probe', 'w').close()\" && "
         "stat -c %a .trainyard/owner_only_probe && rm .trainyard/owner_only_probe"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["0077", "700", "600"]


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another account needs root here")
def test_a_staged_snapshot_cannot_be_read_by_another_account() -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="trainyard-owner-"))
    try:
        base.chmod(0o755)  # the test's own folder is open: only what trainyard made counts
        probe = base / "open"
        probe.write_text("x")
        probe.chmod(0o644)
        assert _as_nobody(probe) == 0  # the check can tell: an open file is read
        env = {**os.environ, "TRAINYARD_VOLUME_ROOT": str(base / "volumes")}
        env.pop("TRAINYARD_PIPELINES_DIR", None)
        run = subprocess.run(
            [sys.executable, "-m", "trainyard", "stage", "--pipeline", "transactions",
             "--interval-start", "2026-11-20", "--interval-end", "2026-11-21"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        (manifest,) = base.glob("volumes/transactions/snapshots/*/manifest.json")
        for path in (manifest, manifest.parent, base / "volumes"):
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
        (base / "volumes").chmod(0o755)  # even with the volume root opened, the snapshot
        (base / "volumes" / "transactions").chmod(0o755)  # and its manifest stay closed
        (manifest.parent.parent).chmod(0o755)
        assert _as_nobody(manifest) == 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
