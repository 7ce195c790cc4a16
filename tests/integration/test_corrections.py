"""Corrections: content decides what an interval's snapshot is, not the interval record.

Real staging into a real volume and real validation (Great Expectations) of a daily CSV
dataset generated in the test (scikit-learn's breast cancer data, one file per day).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daily_csv import LABEL, read_csv, write_contract, write_csv, write_days
from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard import volumes
from trainyard.cli import snapshots as snapshots_cli
from trainyard.config import PipelineConfig
from trainyard.errors import StagingError, ValidationFailed
from trainyard.runs import format_summary
from trainyard.staging import stage
from trainyard.validation import validate

DAY = "2026-11-03"
START, END = f"{DAY}T03:00:00+00:00", "2026-11-04T03:00:00+00:00"


@pytest.fixture
def raw(tmp_path: Path, volume_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "raw"
    write_days(folder, [DAY])
    contracts = tmp_path / "contracts"
    write_contract(contracts)
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(contracts))
    return folder


def _cfg(raw: Path) -> PipelineConfig:
    return PipelineConfig.model_validate(pipeline_dict(raw))


def _record() -> dict:
    return volumes.read_interval("cancer", volumes.interval_key(START, END))


def _break(path: Path) -> None:
    rows = read_csv(path)
    rows[3]["mean_radius"] = "-7.5"  # the contract says min 0
    write_csv(path, rows)


def test_unchanged_source_is_listed_not_read(raw: Path) -> None:
    cfg = _cfg(raw)
    first = stage(cfg, START, END, quiet=True)
    assert not first.reused and "first staging of this interval" in first.checked
    again = stage(cfg, START, END, quiet=True)
    assert again.reused and again.snapshot_id == first.snapshot_id
    assert "source unchanged" in again.checked and "not re-read" in again.checked
    # Only a file's metadata changed (its modification time touched): the content is read
    # and decides, and it is the same
    path = raw / f"{DAY}.csv"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = stage(cfg, START, END, quiet=True)
    assert (
        touched.snapshot_id == first.snapshot_id and "same content as snapshot" in touched.checked
    )
    assert stage(cfg, START, END, quiet=True).checked.startswith("source unchanged")


def test_a_correction_keeping_size_and_modification_time_is_read(raw: Path) -> None:
    """Found by a cold user: a corrected value of the same width, synced with its old
    modification time kept (``cp -p``, ``rsync -t``, ``touch -r``), was "listed, not
    re-read" and the old snapshot trained on. The status-change time, which no user can
    set back, is part of each file's stamp."""
    cfg = _cfg(raw)
    first = stage(cfg, START, END, quiet=True)
    path = raw / f"{DAY}.csv"
    st = path.stat()
    path.write_bytes(path.read_bytes().replace(b"r0000", b"r000X", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    fixed = stage(cfg, START, END, quiet=True)
    assert fixed.snapshot_id != first.snapshot_id and not fixed.reused, fixed.checked
    assert fixed.replaced == first.snapshot_id and "source changed" in fixed.checked


def test_changed_source_makes_a_new_snapshot_for_its_interval(raw: Path) -> None:
    cfg = _cfg(raw)
    first = stage(cfg, START, END, quiet=True)
    path = raw / f"{DAY}.csv"
    rows = read_csv(path)
    write_csv(path, rows[:-5])  # a late correction drops five rows
    second = stage(cfg, START, END, quiet=True)
    assert second.snapshot_id != first.snapshot_id and not second.reused
    assert second.rows == first.rows - 5
    assert "source changed" in second.checked
    record = _record()
    assert record["snapshot_id"] == second.snapshot_id
    assert [r["snapshot_id"] for r in record["replaced"]] == [first.snapshot_id]
    assert "source changed" in record["replaced"][0]["why"]
    # both snapshots stay (retention decides), the interval points at the new one
    assert (volumes.snapshot_dir("cancer", first.snapshot_id) / "manifest.json").is_file()
    # the source put back as it was: same content as the first snapshot, reused, re-pointed
    write_csv(path, rows)
    third = stage(cfg, START, END, quiet=True)
    assert third.snapshot_id == first.snapshot_id and third.reused
    assert "same content as snapshot" in third.checked
    assert _record()["snapshot_id"] == first.snapshot_id


def test_rejected_snapshot_never_blocks_its_interval(raw: Path, capsys) -> None:
    cfg = _cfg(raw)
    path = raw / f"{DAY}.csv"
    _break(path)
    bad = stage(cfg, START, END, quiet=True)
    with pytest.raises(ValidationFailed, match="mean_radius"):
        validate(cfg, bad.snapshot_id)
    # a rerun with the source unchanged reads it again (the record does not pin it) and
    # the same content is rejected again
    rerun = stage(cfg, START, END, quiet=True)
    assert rerun.snapshot_id == bad.snapshot_id
    assert f"snapshot {bad.snapshot_id} was rejected" in rerun.checked
    assert "mean_radius" in rerun.checked
    # snapshots list / show mark it and say why
    assert snapshots_cli.cli_main(["list", "cancer"]) == 0
    listed = capsys.readouterr().out
    line = next(t for t in listed.splitlines() if bad.snapshot_id in t)
    assert "REJECTED" in line and "mean_radius" in line and "min" in line
    assert snapshots_cli.cli_main(["show", "cancer", bad.snapshot_id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["validation"]["state"] == "rejected"
    assert "mean_radius" in shown["validation"]["reason"]
    # the fixed file passes
    rows = read_csv(path)
    rows[3]["mean_radius"] = "7.5"
    write_csv(path, rows)
    fixed = stage(cfg, START, END, quiet=True)
    assert fixed.snapshot_id != bad.snapshot_id and fixed.replaced == bad.snapshot_id
    assert validate(cfg, fixed.snapshot_id).success
    assert volumes.latest_validated("cancer") == fixed.snapshot_id
    assert _record()["snapshot_id"] == fixed.snapshot_id
    assert snapshots_cli.cli_main(["list", "cancer"]) == 0
    listed = capsys.readouterr().out
    fixed_line = next(t for t in listed.splitlines() if t.split()[1] == fixed.snapshot_id)
    bad_line = next(t for t in listed.splitlines() if t.split()[1] == bad.snapshot_id)
    assert f"REPLACED by {fixed.snapshot_id}" in bad_line
    assert "REJECTED" not in fixed_line and "*last validated" in fixed_line
    # once fixed and validated, an unchanged source is not read again
    assert "not re-read" in stage(cfg, START, END, quiet=True).checked


def test_gone_source_keeps_a_good_snapshot_but_not_a_rejected_one(raw: Path) -> None:
    cfg = _cfg(raw)
    path = raw / f"{DAY}.csv"
    good = stage(cfg, START, END, quiet=True)
    assert validate(cfg, good.snapshot_id).success
    saved = path.read_bytes()
    path.unlink()
    kept = stage(cfg, START, END, quiet=True)
    assert kept.reused and kept.snapshot_id == good.snapshot_id
    assert "source not readable now" in kept.checked
    path.write_bytes(saved)
    _break(path)
    bad = stage(cfg, START, END, quiet=True)
    with pytest.raises(ValidationFailed):
        validate(cfg, bad.snapshot_id)
    path.unlink()
    with pytest.raises(StagingError, match="does not exist"):
        stage(cfg, START, END, quiet=True)


def test_the_summary_says_what_staging_checked(raw: Path) -> None:
    cfg = _cfg(raw)
    first = stage(cfg, START, END, quiet=True)
    again = stage(cfg, START, END, quiet=True)
    record = {
        "pipeline": "cancer",
        "run_id": "r",
        "stage": {"snapshot_id": again.snapshot_id, "reused": True, "checked": again.checked},
    }
    line = format_summary(record).splitlines()[1]
    assert line.startswith(f"snapshot      {first.snapshot_id} (reused: source unchanged")
    assert "unchanged data" not in line
    rows = read_csv(raw / f"{DAY}.csv")
    rows[0][LABEL] = str(1 - int(rows[0][LABEL]))
    write_csv(raw / f"{DAY}.csv", rows)
    new = stage(cfg, START, END, quiet=True)
    record["stage"] = {
        "snapshot_id": new.snapshot_id,
        "reused": False,
        "checked": new.checked,
        "replaced": new.replaced,
    }
    line = format_summary(record).splitlines()[1]
    assert f"(new, replaces {first.snapshot_id} for this interval: read 1 file" in line


def test_stage_cli_result_carries_what_was_checked(raw: Path, tmp_path: Path) -> None:
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "cancer.yaml").write_text(json.dumps(pipeline_dict(raw)))
    env = {**os.environ, "TRAINYARD_PIPELINES_DIR": str(pipelines)}
    argv = [sys.executable, "-m", "trainyard", "stage", "--pipeline", "cancer"]
    argv += ["--interval-start", START, "--interval-end", END]
    outs = [subprocess.run(argv, env=env, capture_output=True, text=True) for _ in range(2)]
    assert [o.returncode for o in outs] == [0, 0], outs[-1].stderr
    first, second = (json.loads(o.stdout) for o in outs)
    assert "first staging" in first["checked"] and first["replaced"] is None
    assert "not re-read" in second["checked"] and second["reused"] is True


def test_a_snapshot_rejected_on_revalidation_is_no_longer_the_last_validated(
    tmp_path: Path, raw: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a cold user: after the contract was tightened and the newest snapshot failed
    its revalidation, ``snapshots list`` marked it both ``*validated`` and ``REJECTED``."""
    cfg = _cfg(raw)
    write_days(raw, ["2026-11-02"])
    older = stage(cfg, "2026-11-02", "2026-11-03", quiet=True).snapshot_id
    newer = stage(cfg, START, END, quiet=True).snapshot_id
    assert validate(cfg, older).success and validate(cfg, newer).success
    assert volumes.latest_validated("cancer") == newer
    contract = tmp_path / "contracts" / "cancer.yaml"
    path = raw / f"{DAY}.csv"
    rows = read_csv(path)
    rows[0]["mean_radius"] = "99.5"
    write_csv(path, rows)  # only the newer day has a radius above 50
    newer = stage(cfg, START, END, quiet=True).snapshot_id
    assert validate(cfg, newer).success
    text = contract.read_text()
    contract.write_text(text.replace("name: mean_radius", "name: mean_radius\n  max: 50", 1))
    with pytest.raises(ValidationFailed):
        validate(cfg, newer)

    assert volumes.latest_validated("cancer") == older
    assert snapshots_cli.cli_main(["list", "cancer"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(t for t in lines if newer in t)
    assert "REJECTED" in line and "validated" not in line, line
    assert "*last validated" in next(t for t in lines if older in t)


def test_a_contract_edit_staging_depends_on_reads_the_source_again(
    tmp_path: Path, raw: Path
) -> None:
    """Found by a cold user: after a contract edit without a new version, staging said
    "same contract (listed, not re-read)". A rule's bound does not change what staging
    writes (validation applies it again, and says so); a column's type does, and the
    source is read again."""
    cfg = _cfg(raw)
    first = stage(cfg, START, END, quiet=True)
    contract = tmp_path / "contracts" / "cancer.yaml"
    text = contract.read_text()
    contract.write_text(text.replace("name: mean_radius\n", "name: mean_radius\n  max: 27\n", 1))
    bound = stage(cfg, START, END, quiet=True)
    assert bound.reused and "validation applies the contract's rules again" in bound.checked
    typed = text.replace(
        "name: mean_texture\n  type: float64", "name: mean_texture\n  type: float32"
    )
    assert typed != text
    contract.write_text(typed)
    retyped = stage(cfg, START, END, quiet=True)
    assert not retyped.reused and retyped.snapshot_id != first.snapshot_id
    assert "the contract's version or columns differ" in retyped.checked


def test_snapshots_list_marks_the_snapshot_a_correction_replaced(raw: Path, capsys) -> None:
    """Found by a cold user: after a corrected day was reprocessed, ``snapshots list``
    showed both of its snapshots with no mark to tell which the interval used."""
    cfg = _cfg(raw)
    first = stage(cfg, START, END, quiet=True)
    path = raw / f"{DAY}.csv"
    rows = read_csv(path)
    write_csv(path, rows[:-5])
    second = stage(cfg, START, END, quiet=True)

    def lines() -> dict[str, str]:
        capsys.readouterr()
        assert snapshots_cli.cli_main(["list", "cancer"]) == 0
        out = capsys.readouterr().out.splitlines()
        return {sid: next(line for line in out if sid in line.split()[1]) for sid in ids}

    ids = (first.snapshot_id, second.snapshot_id)
    listed = lines()
    assert f"REPLACED by {second.snapshot_id} at " in listed[first.snapshot_id]
    assert "REPLACED" not in listed[second.snapshot_id]
    write_csv(path, rows)  # put back: the interval points at the first one again
    assert stage(cfg, START, END, quiet=True).snapshot_id == first.snapshot_id
    listed = lines()
    assert "REPLACED" not in listed[first.snapshot_id]
    assert f"REPLACED by {first.snapshot_id} at " in listed[second.snapshot_id]
