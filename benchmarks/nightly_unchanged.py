"""Benchmark: a nightly run on unchanged data vs staging and validation alone.

A nightly run whose data, config and code did not change should cost what checking the
data costs: staging finds the source unchanged, validation runs the contract again, and
then nothing trains (the version trained on the same fingerprint is reused) and the gate
reads cached scores. Both sides run the digits pipeline in a fresh interpreter, on the
same volume, primed by one real run (trained, gated, served):

* ours: ``python -m trainyard run --pipeline digits`` (stage, validate, plan: reuse,
  evaluate: keep, summary), checked to have trained 0 s;
* baseline: a fresh interpreter that runs the ``stage`` and ``validate`` steps of the
  same interval, and nothing else.

    python benchmarks/nightly_unchanged.py --runs 3

Last line: ``BENCH nightly_unchanged ratio=<ours/baseline> ours=<s> baseline=<s>
ours_range=<lo-hi> baseline_range=<lo-hi> load=<1-min load average>`` (medians; the
issue's bound is ratio <= 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

BASELINE = """
import logging, sys
sys.path.insert(0, {plugins!r})
logging.basicConfig(level=logging.WARNING)
from trainyard.config import load_pipeline
from trainyard.steps import data_intervals, stage, validate
start, end = data_intervals(load_pipeline("digits"))[0]
staged = stage("digits", start[:10], end[:10])
assert staged["reused"], staged
validate("digits", staged["snapshot_id"], start[:10])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def project(tmp: Path, epochs: int) -> dict[str, str]:
    """A volume and a pipelines folder of its own (the shipped digits, its own port)."""
    cfg = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    cfg["training"]["epochs"] = epochs
    cfg["serving"]["port"] = _free_port()
    (tmp / "pipelines").mkdir()
    (tmp / "pipelines" / "digits.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ)
    env.update(
        TRAINYARD_PROJECT_DIR=str(ROOT),
        TRAINYARD_VOLUME_ROOT=str(tmp / "volumes"),
        TRAINYARD_PIPELINES_DIR=str(tmp / "pipelines"),
        TRAINYARD_RUNNER="local",
        PYTHONPATH=str(ROOT / "plugins"),
    )
    return env


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds ``argv`` takes (it must succeed)."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:4])} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
    return seconds


def main() -> None:
    """Run the benchmark and print the BENCH line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per side (default 3)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the priming run")
    args = parser.parse_args()
    ours_argv = [sys.executable, "-m", "trainyard", "run", "--pipeline", "digits"]
    base_argv = [sys.executable, "-c", BASELINE.format(plugins=str(ROOT / "plugins"))]
    with tempfile.TemporaryDirectory(prefix="bench-nightly-") as tmp:
        env = project(Path(tmp), args.epochs)
        last_run = Path(tmp) / "volumes" / "_models" / "digits" / "last_run.json"
        try:
            primed = timed(ours_argv, env)  # stages, trains, gates, serves version 1
            print(f"priming run (trains and serves): {primed:.1f} s")
            ours, base = [], []
            for i in range(args.runs):  # alternate which side goes first
                for side in ("ours", "base") if i % 2 == 0 else ("base", "ours"):
                    if side == "ours":
                        ours.append(timed(ours_argv, env))
                        train = json.loads(last_run.read_text())["train"]
                        assert train["reused"] and train["seconds"] == 0, train
                    else:
                        base.append(timed(base_argv, env))
        finally:
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from trainyard.serving.deploy import stop_local_server\n"
                    "from trainyard.settings import get_settings\n"
                    "stop_local_server(get_settings().serving_root)",
                ],
                env=env,
                cwd=ROOT,
                check=False,
                capture_output=True,
            )
    o, b = statistics.median(ours), statistics.median(base)
    load = os.getloadavg()[0]
    print(
        f"nightly run on unchanged data {o:.2f} s ({min(ours):.2f}-{max(ours):.2f}), "
        f"staging + validation alone {b:.2f} s ({min(base):.2f}-{max(base):.2f}), "
        f"{args.runs} runs each, load average {load:.2f}"
    )
    print(
        f"BENCH nightly_unchanged ratio={o / b:.3f} ours={o:.3f} baseline={b:.3f} "
        f"ours_range={min(ours):.2f}-{max(ours):.2f} "
        f"baseline_range={min(base):.2f}-{max(base):.2f} load={load:.2f}"
    )


if __name__ == "__main__":
    main()
