"""A step's process: the start-up it logs, the exit without teardown, the reads it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainyard.fsutil import read_parquet
from trainyard.steps import process_age

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "plugins"), env.get("PYTHONPATH", "")])
    return env


def test_finish_does_what_an_exit_does_but_the_teardown(tmp_path: Path) -> None:
    code = f"""
import atexit, pathlib, sys, threading, time
from trainyard.cli import finish
atexit.register(lambda: pathlib.Path({str(tmp_path / "atexit")!r}).write_text("ran"))
def late():
    time.sleep(0.3)
    pathlib.Path({str(tmp_path / "thread")!r}).write_text("joined")
threading.Thread(target=late).start()
sys.stdout.write("no newline, still flushed")
finish(7)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "no newline, still flushed"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"


def test_a_step_logs_its_start_up_and_keeps_its_exit_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainyard", "summary", "--pipeline", "no_such_pipeline"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    started = re.search(
        r"summary: started after ([\d.]+) s \(python and trainyard ([\d.]+) s\)", proc.stderr
    )
    assert started, proc.stderr
    assert 0 < float(started.group(1)) < 60
    assert "unknown pipeline 'no_such_pipeline'" in proc.stderr


def test_process_age_is_the_time_since_the_process_started() -> None:
    first = process_age()
    time.sleep(0.2)
    assert 0.15 < process_age() - first < 5
    assert first > 0


def test_read_parquet_reads_columns_in_order_and_refuses_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"key": ["a", "b"], "label": [1, 2], "x": [0.5, 1.5]}), path)
    table = read_parquet(path, ["x", "key"])
    assert table.column_names == ["x", "key"]
    assert table.column("key").to_pylist() == ["a", "b"]
    with pytest.raises(pa.ArrowInvalid, match="nope"):
        read_parquet(path, ["key", "nope"])
    with pytest.raises(FileNotFoundError):
        read_parquet(tmp_path / "missing.parquet", ["key"])
    # pq.read_table imports pyarrow.dataset (0.3-0.6 s of a step's start-up); this does not
    code = (
        "import sys; from trainyard.fsutil import read_parquet; "
        f"read_parquet({str(path)!r}, ['key']); print('pyarrow.dataset' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert out.stdout.strip() == "False", out.stderr
