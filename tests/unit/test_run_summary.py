"""The lines ``trainyard run`` (and the run's note) ends with: what a person reads first."""

from __future__ import annotations

from pathlib import Path


def test_the_run_summary_says_what_scores_the_stream(tmp_path: Path, monkeypatch) -> None:
    """Found by a cold user: the summary of a run whose deploy started the stream scorer
    said nothing of it (only the deploy step's JSON did)."""
    from trainyard import runs, steps

    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    scorer = "scorer running (pid 7) on redis transactions.in"
    deploy = {"version": 1, "url": "http://127.0.0.1:8501/v1/models/mlp", "scorer": scorer}
    record = steps.summary("transactions", "run-1", {"register": {"version": 1}, "deploy": deploy})
    assert f"stream        {scorer}" in runs.format_summary(record).splitlines()


def test_a_day_that_did_not_train_says_so_not_first_run(tmp_path: Path, monkeypatch) -> None:
    """Found by a cold user: the summaries of a range's days that did not train said
    ``champion none (first run)`` and ``gate not run: -`` with a champion in place."""
    from trainyard import runs, steps

    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    stage = {"snapshot_id": "0123456789abcdef", "reused": False, "rows": 600}
    record = steps.summary("digits", "run-1", {"stage": stage, "validate": {"success": True}})
    lines = {line[:14].strip(): line[14:] for line in runs.format_summary(record).splitlines()}
    assert lines["champion"] == "not compared (this run evaluated nothing)"
    assert lines["gate"] == "not run: this run did not train (backfill_training, or a dry run)"
