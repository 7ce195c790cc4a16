"""Known TensorFlow and Great Expectations start-up noise stays out of task logs."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard import lognoise

ROOT = Path(__file__).resolve().parents[2]

# lines a training worker printed on this machine (no GPU), before absl reads its settings
TF_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795635511.440970    3093 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1795635516.954412    3093 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0000 00:00:1795635521.156701    3044 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
    # MultiWorkerMirroredStrategy, several times per step
    "2026-11-25 22:54:48,102 INFO tensorflow: Collective all_reduce tensors: 1 all_reduces, "
    "num_devices = 1, group_size = 2, implementation = CommunicationImplementation.AUTO, "
    "num_packs = 1",
]
KEPT = [
    "[worker:0] Epoch 1/4",
    "[worker:0] epoch 1/2 step 4/22 loss 2.2484, 2.5 steps/s, ETA 16s",
    "E0000 00:00:1795635516.954412    3093 some_kernel.cc:52] INTERNAL: out of memory",
    "trainyard.training.worker [worker:0]: TrainingError: the training split is empty",
    "2026-11-25 19:38:31 INFO trainyard.steps: cuda drivers are mentioned by a user",
]


@pytest.mark.parametrize("line", TF_LINES)
def test_tensorflow_start_up_lines_are_noise(line: str, monkeypatch) -> None:
    monkeypatch.delenv(lognoise.VERBOSE_ENV, raising=False)
    assert lognoise.is_noise(line)
    monkeypatch.setenv(lognoise.VERBOSE_ENV, "1")
    assert not lognoise.is_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_real_errors_and_progress_are_kept(line: str, monkeypatch) -> None:
    monkeypatch.delenv(lognoise.VERBOSE_ENV, raising=False)
    assert not lognoise.is_noise(line)


def test_the_step_cli_keeps_great_expectations_info_out(tmp_path: Path) -> None:
    """Importing GX through the CLI logs nothing at INFO; verbose brings it back."""
    code = (
        "import sys, logging; from trainyard import cli; "
        "cli.logging.basicConfig(level=logging.INFO); cli.quiet_libraries(); "
        "import great_expectations; print('imported')"
    )
    env = {"PYTHONPATH": str(ROOT / "plugins"), "PATH": "/usr/bin:/bin"}
    quiet = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert quiet.returncode == 0 and "imported" in quiet.stdout, quiet.stderr[-2000:]
    assert "great_expectations" not in quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, lognoise.VERBOSE_ENV: "1"},
        timeout=300,
    )
    assert "INFO:great_expectations" in loud.stderr


def test_quiet_libraries_lowers_only_the_named_loggers(monkeypatch) -> None:
    monkeypatch.delenv(lognoise.VERBOSE_ENV, raising=False)
    lognoise.quiet_libraries()
    assert logging.getLogger("great_expectations._docs_decorators").getEffectiveLevel() == (
        logging.WARNING
    )
    assert logging.getLogger("great_expectations").level == logging.WARNING
    assert logging.getLogger("trainyard").level == logging.NOTSET
