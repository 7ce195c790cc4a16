"""A mistyped option is named as such, with the nearest real one.

argparse checks required options before unknown ones, so ``run --pipline digits`` said
REQUIRED + "--pipeline" to a user who had typed it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from trainyard import argtypes

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
RUN, TOOL = "tool run: error: ", "tool: error: "
REQUIRED = "the following arguments are required: "
UNKNOWN = "unrecognized argument: "


def _parser() -> argtypes.ArgumentParser:
    parser = argtypes.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--pipeline", required=True)
    run.add_argument("--overrides")
    run.add_argument("--reason")
    return parser


def _usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(list(args))
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--pipline", "x"], RUN + UNKNOWN + "--pipline (did you mean --pipeline?)"),
        (["run", "--pipeline=x", "--overides={}"], RUN + UNKNOWN + "--overides (did you mean --overrides?)"),  # noqa: E501
        (["run", "--pipeline", "x", "--zzz"], RUN + UNKNOWN + "--zzz"),
        (["run", "--pipeline", "x", "extra"], TOOL + "unrecognized arguments: extra"),
        # still the missing option when nothing unknown was given (an abbreviation is known)
        (["run", "--reason", "r"], RUN + REQUIRED + "--pipeline"),
        (["run", "--reas", "r"], RUN + REQUIRED + "--pipeline"),
        # a value after -- is not an option
        (["run", "--reason", "r", "--", "--pipline"], RUN + REQUIRED + "--pipeline"),
        # a missing command is the error, not an option meant for it
        (["--pipeline=x"], TOOL + REQUIRED + "command"),
    ],
)  # fmt: skip
def test_usage_error_names_the_mistake(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert _usage_error(capsys, *args) == message


def test_parse_still_parses() -> None:
    got = _parser().parse_args(["run", "--pipe", "digits", "--overrides", "{}"])
    assert (got.command, got.pipeline, got.overrides) == ("run", "digits", "{}")


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["run", "--pipline", "digits"], "--pipline (did you mean --pipeline?)"),
        (["score-stream", "--pipline", "events"], "--pipline (did you mean --pipeline?)"),
        (["models", "list", "--pipeline", "digits", "--lmit", "3"], "--lmit"),
        (["snapshots", "list", "digits", "--xyz"], "--xyz"),
    ],
)
def test_the_cli_names_a_mistyped_option(command: list[str], message: str) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "trainyard", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert got.returncode == 2, got
    assert got.stderr.strip().splitlines()[-1].endswith(f"unrecognized argument: {message}")


@pytest.mark.parametrize("text", ["2026-11-5", "20261105", "2026-11-05T00:00", "yesterday"])
def test_a_day_not_written_yyyy_mm_dd_says_how(text: str) -> None:
    """Found by a cold user: ``--ds 2026-11-5`` said "invalid fromisoformat value"."""
    with pytest.raises(argparse.ArgumentTypeError, match="is not a day written YYYY-MM-DD"):
        argtypes.day(text)
    assert str(argtypes.day("2026-11-05")) == "2026-11-05"


def test_a_day_that_does_not_exist_says_so() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="'2026-11-31' is no calendar day"):
        argtypes.day("2026-11-31")


def test_an_unknown_training_override_is_a_usage_error() -> None:
    """Found by a cold user: ``run --overrides '{"epoch": 2}'`` exited 3 (a failure no retry
    fixes), though the README calls an unknown option a usage error (2)."""
    overrides = ["--overrides", '{"epoch": 2}']
    got = subprocess.run(
        [sys.executable, "-m", "trainyard", "run", "--pipeline", "digits", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert got.returncode == 2, got
    assert "--overrides: unknown training override(s) ['epoch']" in got.stderr


def test_run_of_an_unknown_pipeline_exits_3_as_a_step_does() -> None:
    """Found by a cold user: ``run --pipeline sensor`` exited 2 and ``stage`` 3; the README
    gives 3 for an unknown pipeline."""
    for command in ("run", "stage"):
        got = subprocess.run(
            [sys.executable, "-m", "trainyard", command, "--pipeline", "nope_not_here"],
            capture_output=True,
            text=True,
            timeout=120,
            env=ENV,
        )
        assert got.returncode == 3, (command, got.stderr)
        assert "ConfigError: unknown pipeline 'nope_not_here'" in got.stderr
