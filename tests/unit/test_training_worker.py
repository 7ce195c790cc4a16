"""The worker program's command line: bad input exits with the non-retryable code at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.training.worker.main import EXIT_BAD_INPUT, Fault, active_fault
from trainyard.training.worker.tf_config import Role

ROOT = Path(__file__).resolve().parents[2]
GOOD_TF_CONFIG = json.dumps(
    {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
)


def _run(tmp_path: Path, env: dict[str, str], contract: Path) -> subprocess.CompletedProcess[str]:
    args = ["--snapshot-dir", str(tmp_path), "--contract", str(contract), "--model", "mlp",
            "--strategy", "multi_worker_mirrored", "--epochs", "1", "--batch-size", "8",
            "--learning-rate", "0.1", "--checkpoint-dir", str(tmp_path / "ck"),
            "--output-dir", str(tmp_path / "out")]  # fmt: skip
    full_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT / "plugins"), **env}
    return subprocess.run(
        [sys.executable, "-m", "trainyard.training.worker", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "contract", "message"),
    [
        ({}, "data_contracts/digits.yaml", "TF_CONFIG is unset and cannot be derived: missing"),
        ({"TF_CONFIG": "{"}, "data_contracts/digits.yaml", "TF_CONFIG is not valid JSON"),
        ({"TF_CONFIG": GOOD_TF_CONFIG}, "data_contracts/nope.yaml", "nope.yaml"),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"], "ps": ["b:1"]},
                                      "task": {"type": "ps", "index": 0}})},
            "data_contracts/digits.yaml",
            "multi_worker_mirrored has no parameter servers",
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                      "task": {"type": "worker", "index": 5}})},
            "data_contracts/digits.yaml",
            "task.index 5 out of range for worker (0..1)",
        ),
    ],
    ids=["no-tf-config", "tf-config-not-json", "missing-contract", "ps-task-under-mwms",
         "task-index-out-of-range"],
)  # fmt: skip
def test_bad_input_exits_non_retryable(
    tmp_path: Path, env: dict, contract: str, message: str
) -> None:
    res = _run(tmp_path, env, ROOT / contract)
    assert res.returncode == EXIT_BAD_INPUT, res.stderr
    # 3: a failure no retry fixes, as for every command (4 would say "nothing to do")
    assert EXIT_BAD_INPUT == 3
    assert message in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("spec", "role", "attempt", "expected"),
    [
        ("kill_mid_epoch:1:worker:1", Role("worker", 1, 2, False), 1, Fault("kill_mid_epoch", 1)),
        ("kill_mid_epoch:1:worker:1", Role("worker", 1, 2, False), 2, None),
        ("kill_mid_epoch:1:worker:1", Role("worker", 0, 2, False), 1, None),
        ("a:0:chief:0,hang_before_ready:0:worker:0:2", Role("worker", 0, 1, False), 2,
         Fault("hang_before_ready", 0)),
        (None, Role("worker", 0, 1, False), 1, None),
    ],
    ids=["targets-this-task", "other-attempt", "other-task", "second-of-list", "unset"],
)  # fmt: skip
def test_fault_targeting(
    spec: str | None, role: Role, attempt: int, expected: Fault | None
) -> None:
    assert active_fault(spec, role, attempt) == expected
