"""Benchmark: a local training with its pods forked from the fork server vs started plainly.

Both sides run the same two-worker digits training (``run_training``: the rendered Jobs'
pods as local processes, 1 epoch on 640 images) in a fresh interpreter:

* ours: the workers are forks of :mod:`trainyard.forkserver` (TensorFlow imported once,
  the server already running, as from a launcher's second pod on);
* baseline: ``TRAINYARD_FORK_SERVER=0``, every worker a plain ``python -m trainyard worker``.

Wall time is the driver's; CPU is the whole machine's busy time over the run
(``/proc/stat``), so it counts the forked workers, which are not the driver's children.
Rounds alternate the two sides.

    python benchmarks/pod_start.py --rounds 3

Last line: ``BENCH pod_start ratio=<ours/baseline wall> cpu_ratio=<ours/baseline CPU>
ours=<s> baseline=<s> ours_cpu=<s> baseline_cpu=<s> ...`` (medians, ranges).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = """
import sys
sys.path[:0] = [{plugins!r}, {root!r}]
from tests.support.trainer import make_files_snapshot, publish_fixture
from trainyard.config import TrainingConfig, parse_pipeline
from trainyard.training.launcher import run_training
from pathlib import Path
volume_root = Path({volume!r})
snap = publish_fixture(make_files_snapshot(volume_root / "incoming", n=640, shards=2),
                       volume_root, "digits")
params = TrainingConfig(model="small_cnn", workers=2, batch_size=32, learning_rate=0.003,
                        steps_per_execution=1, epochs=1)
pipeline = parse_pipeline(Path({root!r}) / "dags" / "pipelines" / "digits.yaml")
result = run_training(pipeline, params, snap, run_id="bench", log=lambda _line: None)
assert result.attempts == 1, result
"""


def _busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def one(warm: bool) -> tuple[float, float]:
    """(wall s, machine CPU s) of one training."""
    with tempfile.TemporaryDirectory(prefix="bench-pods-") as tmp:
        volume = Path(tmp) / "volumes"
        volume.mkdir()
        env = dict(
            os.environ,
            TRAINYARD_VOLUME_ROOT=str(volume),
            TRAINYARD_FORK_SERVER="1" if warm else "0",
            PYTHONPATH=str(ROOT / "plugins"),
        )
        code = DRIVER.format(plugins=str(ROOT / "plugins"), root=str(ROOT), volume=str(volume))
        cpu0, t0 = _busy_s(), time.monotonic()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp)
        return time.monotonic() - t0, _busy_s() - cpu0


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main() -> None:
    """Run the rounds and print the BENCH line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    one(True)  # starts the fork server (its first pods start plainly)
    time.sleep(15)  # it imports TensorFlow and Great Expectations, then listens
    ours: list[tuple[float, float]] = []
    base: list[tuple[float, float]] = []
    for i in range(args.rounds):
        for warm in (True, False) if i % 2 == 0 else (False, True):
            wall, cpu = one(warm)
            (ours if warm else base).append((wall, cpu))
            side = "ours" if warm else "baseline"
            print(f"round {i + 1} {side}: wall {wall:.2f} s, machine CPU {cpu:.2f} s", flush=True)
    walls = [o[0] / b[0] for o, b in zip(ours, base, strict=True)]
    cpus = [o[1] / b[1] for o, b in zip(ours, base, strict=True)]
    med = statistics.median
    print(
        f"BENCH pod_start ratio={med(walls):.3f} cpu_ratio={med(cpus):.3f} "
        f"ours={med(o[0] for o in ours):.2f} baseline={med(b[0] for b in base):.2f} "
        f"ours_cpu={med(o[1] for o in ours):.2f} baseline_cpu={med(b[1] for b in base):.2f} "
        f"ratio_range={_span(walls)} cpu_ratio_range={_span(cpus)} "
        f"load={os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
