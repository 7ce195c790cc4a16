"""``trainyard serve``'s flags: a value that would break the server is one usage error.

A cold user's run found ``--intra-op-threads -1`` aborting TensorFlow after the server
listened, ``--port 99999`` serving on another port, ``--poll-interval 0`` burning a core,
tracebacks for ``--model-threads 0`` and a taken port, and ``--max-rows 0``,
``--max-body-mb -1`` or ``--body-timeout 0`` accepted by a server that then refused every
request.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard import argtypes

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard", "serve", "--base-path", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--intra-op-threads", "-1"], "argument --intra-op-threads: -1 is negative"),
        (["--port", "99999"], "argument --port: port 99999 is not in 0..65535"),
        (["--poll-interval", "0"], "argument --poll-interval: 0 is not above 0"),
        (["--poll-interval", "0.001"], "argument --poll-interval: at least 0.05 s"),
        (["--model-threads", "0"], "argument --model-threads: 0 is not a positive integer"),
        (["--max-rows", "-5"], "argument --max-rows: -5 is not a positive integer"),
        (["--max-body-mb", "-1"], "argument --max-body-mb: -1 is not above 0"),
        (["--body-timeout", "nan"], "argument --body-timeout: 'nan' is not a finite number"),
        (["--grpc-port", "18611", "--port", "18611"], "argument --grpc-port: 18611 is also"),
    ],
)
def test_a_bad_flag_is_one_usage_error(tmp_path: Path, flags: list[str], message: str) -> None:
    done = _serve(tmp_path, *flags)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_taken_port_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--port", str(port), "--poll-interval", "3600")
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("kind", "text", "value"),
    [
        (argtypes.port, "8501", 8501),
        (argtypes.port_or_zero, "0", 0),
        (argtypes.positive_int, "3", 3),
        (argtypes.non_negative_int, "0", 0),
        (argtypes.positive_float, "0.5", 0.5),
    ],
)
def test_good_values_pass(kind, text: str, value: float) -> None:
    assert kind(text) == value


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        (argtypes.port, "0"),
        (argtypes.port, "65536"),
        (argtypes.port, "http"),
        (argtypes.positive_int, "1.5"),
        (argtypes.non_negative_int, "-1"),
        (argtypes.positive_float, "inf"),
        (argtypes.positive_float, "-0.1"),
    ],
)
def test_bad_values_are_argument_errors(kind, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        kind(text)
