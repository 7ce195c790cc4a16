"""Steps run by hand (``python -m trainyard <step> ...``) with the typos people make.

Each was found by a new user: the step took the value, wrote a record named after it,
and exited 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard import steps
from trainyard.cli import main as cli
from trainyard.errors import ConfigError
from trainyard.steps import EXIT_DETERMINISTIC


@pytest.mark.parametrize(
    ("start", "end", "says"),
    [
        ("notadate", None, "interval_start 'notadate' is not an ISO date (YYYY-MM-DD)"),
        ("20261120", None, "interval_start '20261120' is not an ISO date (YYYY-MM-DD)"),
        ("2026-10-01", None, "interval_start 2026-10-01 is before the pipeline's start_date"),
        ("2026-11-10", "2026-11-05", "interval_end 2026-11-05 is before interval_start"),
        ("2026-11-10", "11/12/2026", "interval_end '11/12/2026' is not an ISO date"),
        ("2099-01-01", "2099-01-02", "interval_start 2099-01-01 is in the future"),
        (None, "2026-11-05", "interval_end '2026-11-05' without an interval_start"),
    ],
)
def test_stage_refuses_an_interval_no_run_can_have(
    volume_root: Path, capsys: pytest.CaptureFixture[str], start, end, says: str
) -> None:
    argv = ["stage", "--pipeline", "digits"]
    argv += ["--interval-start", start] if start else []
    argv += ["--interval-end", end] if end else []
    assert cli(argv) == EXIT_DETERMINISTIC
    assert says in capsys.readouterr().err
    assert not list(volume_root.rglob("intervals/*.json"))  # nothing recorded


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("2026-11-05", "2026-11-05"),  # a run without a data interval, or an hourly run's
        ("2026-11-05T02:00:00+00:00", "2026-11-06T02:00:00+00:00"),
        ("2026-11-05T02:00:00Z", None),
    ],
)
def test_intervals_runs_have_pass(start: str, end: str | None) -> None:
    steps.check_interval(start, end)


def test_check_interval_names_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="interval_start '2026-13-01' is not an ISO date"):
        steps.check_interval("2026-13-01", None)


def test_summary_of_a_run_never_recorded_is_refused_not_recorded(
    volume_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["summary", "--pipeline", "digits", "--run-id", "nope"]) == EXIT_DETERMINISTIC
    assert "no run 'nope' of pipeline 'digits' recorded" in capsys.readouterr().err
    assert not list(volume_root.rglob("*.json"))
    recorded = ["summary", "--pipeline", "digits", "--run-id", "run-1", "--results", "{}"]
    assert cli(recorded) == 0
    capsys.readouterr()
    assert cli(["summary", "--pipeline", "digits", "--run-id", "run-1"]) == 0
    assert '"run_id": "run-1"' in capsys.readouterr().out


def test_train_refuses_a_snapshot_validation_rejected(volume_root: Path) -> None:
    """Found by a cold user: ``train --snapshot-id`` of a snapshot listed ``REJECTED``
    registered a version trained on it, with nothing saying so."""
    import json

    from tests.support.trainer import make_files_snapshot, publish_fixture
    from trainyard.errors import ValidationFailed

    sid = publish_fixture(
        make_files_snapshot(volume_root / "incoming", n=40, shards=1), volume_root, "digits"
    )
    report = volume_root / "digits" / "snapshots" / sid / "validation"
    report.mkdir()
    failure = {"rule": "range", "column": "label", "reason": "1 value(s) outside [0, 9]"}
    (report / "rejected.json").write_text(json.dumps({"success": False, "failures": [failure]}))
    with pytest.raises(ValidationFailed, match=rf"snapshot {sid} of digits was rejected by "
                       r"validation \(range label: 1 value\(s\) outside \[0, 9\]\)"):  # fmt: skip
        steps.train("digits", sid, "by-hand")
    assert not (volume_root / "_checkpoints").exists()
    assert not (volume_root / "_models").exists()


def test_summary_of_the_last_run_says_when_the_champion_moved_since(
    volume_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a cold user: after later runs failed and a person promoted another
    version, ``summary`` printed the last recorded run's "served version 1" as if current."""
    import json

    from trainyard.registry import Registry

    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"pb")
    (model / "variables" / "variables.index").write_bytes(b"index")

    results = {"deploy": {"version": 1, "url": "http://x/v1/models/digits/versions/1"}}
    assert cli(["summary", "--pipeline", "digits", "--run-id", "r1", "--results",
                json.dumps(results)]) == 0  # fmt: skip
    capsys.readouterr()
    reg = Registry(volume_root / "_models", "digits")
    for _ in range(2):
        reg.register(model, {"dataset": "digits", "snapshot_id": "s1"})
    reg.promote(1, "first", "al")
    assert cli(["summary", "--pipeline", "digits"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipeline      digits   run r1 (finished 20") and "now " not in out
    reg.promote(2, "by hand", "al")
    assert cli(["summary", "--pipeline", "digits"]) == 0
    assert "now           the champion is version 2 (python -m trainyard models history)" in (
        capsys.readouterr().out
    )
