"""Missing partitions are a state (``source.when_missing``), and data that breaks the
contract at staging fails without retry: the real ``python -m trainyard stage`` command,
its exit code and its termination message, on daily CSV files generated here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daily_csv import DATASET, read_csv, write_contract, write_csv, write_days
from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard.cli import snapshots as snapshots_cli
from trainyard.config import PipelineConfig
from trainyard.errors import StagingError
from trainyard.steps import EXIT_DETERMINISTIC, EXIT_FAILED, EXIT_OK, EXIT_SKIPPED

DAY = "2026-11-03"


@pytest.fixture
def env(tmp_path: Path, volume_root: Path) -> dict[str, str]:
    write_days(tmp_path / "raw", [DAY])
    write_contract(tmp_path / "contracts")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    for mode in ("fail", "skip", "wait"):
        cfg = pipeline_dict(tmp_path / "raw", source={"when_missing": mode})
        cfg["name"] = cfg["serving"]["model_name"] = f"cancer_{mode}"
        (pipelines / f"cancer_{mode}.yaml").write_text(json.dumps(cfg))
    return {
        **os.environ,
        "TRAINYARD_PIPELINES_DIR": str(pipelines),
        "TRAINYARD_CONTRACTS_DIR": str(tmp_path / "contracts"),
        "TRAINYARD_TERMINATION_LOG": str(tmp_path / "termination.log"),
    }


def _stage(env: dict[str, str], pipeline: str, day: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "trainyard", "stage", "--pipeline", pipeline]
    argv += ["--interval-start", day, "--interval-end", day]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def _termination(env: dict[str, str]) -> str:
    return Path(env["TRAINYARD_TERMINATION_LOG"]).read_text()


@pytest.mark.parametrize(
    ("pipeline", "code", "says"),
    [
        ("cancer_fail", EXIT_DETERMINISTIC, "SourceMissing"),
        ("cancer_skip", EXIT_SKIPPED, "skipped"),
        ("cancer_wait", EXIT_DETERMINISTIC, "SourceMissing"),  # the sensor waited already
    ],
)
def test_a_missing_partition_is_a_state(env, pipeline: str, code: int, says: str) -> None:
    out = _stage(env, pipeline, "2026-11-04")
    assert out.returncode == code, out.stderr
    message = _termination(env)
    assert says in message and "2026-11-04.csv: source does not exist" in message
    assert out.returncode != EXIT_FAILED  # never "a retry may fix it"


def test_the_partition_present_stages(env) -> None:
    for mode in ("fail", "skip", "wait"):
        out = _stage(env, f"cancer_{mode}", DAY)
        assert out.returncode == EXIT_OK, out.stderr
        assert json.loads(out.stdout)["rows"] == 569


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("drop a column", "column 'mean_radius' of the contract is missing"),
        ("add a column", "column 'surprise' is not in the contract"),
        ("a value that does not cast", "row 4"),
    ],
)
def test_data_that_breaks_the_contract_fails_without_retry(
    env, tmp_path: Path, change: str, says: str
) -> None:
    path = tmp_path / "raw" / f"{DAY}.csv"
    rows = read_csv(path)
    if change == "drop a column":
        rows = [{k: v for k, v in r.items() if k != "mean_radius"} for r in rows]
    elif change == "add a column":
        rows = [{**r, "surprise": "1"} for r in rows]
    else:
        rows[2]["mean_area"] = "a lot"
    write_csv(path, rows)
    out = _stage(env, "cancer_fail", DAY)
    assert out.returncode == EXIT_DETERMINISTIC, out.stderr
    message = _termination(env)
    assert "SourceInvalid" in message and says in message


def test_when_missing_is_checked_and_defaults_to_fail(tmp_path: Path) -> None:
    cfg = PipelineConfig.model_validate(pipeline_dict(tmp_path))
    assert cfg.source.when_missing == "fail"
    with pytest.raises(ValueError, match="when_missing"):
        PipelineConfig.model_validate(pipeline_dict(tmp_path, source={"when_missing": "later"}))
    with pytest.raises(ValueError, match="wait_timeout_s"):
        PipelineConfig.model_validate(pipeline_dict(tmp_path, source={"wait_timeout_s": 0}))


def test_only_wait_adds_a_sensor_before_staging(tmp_path: Path) -> None:
    from trainyard.orchestration.graph import build_dag
    from trainyard.orchestration.sensors import SourcePartitionSensor, source_present

    for mode in ("fail", "skip"):
        dag = build_dag(
            PipelineConfig.model_validate(
                pipeline_dict(tmp_path / "raw", source={"when_missing": mode})
            )
        )
        assert "wait_for_source" not in dag.task_dict
    spec = pipeline_dict(
        tmp_path / "raw", source={"when_missing": "wait", "wait_timeout_s": 60, "wait_poke_s": 5}
    )
    cfg = PipelineConfig.model_validate(spec)
    dag = build_dag(cfg)
    sensor = dag.task_dict["wait_for_source"]
    assert isinstance(sensor, SourcePartitionSensor)
    assert sensor.mode == "reschedule" and sensor.timeout == 60 and sensor.poke_interval == 5
    assert dag.task_dict["stage"].upstream_task_ids == {"wait_for_source"}
    assert not source_present(cfg, DAY)
    write_days(tmp_path / "raw", [DAY])
    assert source_present(cfg, DAY)


def test_the_rendered_stage_pod_skips_on_the_local_runner(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod the cluster would run, run as a process: exit 4 is a skip, with the reason."""
    from trainyard.config import load_pipeline
    from trainyard.k8s.profile import load_cluster_profile
    from trainyard.orchestration.runners import StepFailed, run_pod_locally
    from trainyard.pods import step_pod
    from trainyard.settings import get_settings

    for name in ("TRAINYARD_PIPELINES_DIR", "TRAINYARD_CONTRACTS_DIR"):
        monkeypatch.setenv(name, env[name])
    settings = get_settings()
    profile = load_cluster_profile(settings.cluster_profile)
    values = {"interval_start": "2026-11-04", "interval_end": "2026-11-05"}
    for name, skipped in (("cancer_skip", True), ("cancer_fail", False)):
        pod = step_pod(profile, load_pipeline(name), "stage", values)
        with pytest.raises(StepFailed) as err:
            run_pod_locally(pod, settings, log=lambda line: None)
        assert err.value.skipped is skipped and err.value.deterministic is True
        assert "2026-11-04.csv: source does not exist" in str(err.value)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _run_pipeline(env, "cancer_skip", *args)


def _run_pipeline(env: dict[str, str], pipeline: str, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "trainyard", "run", "--pipeline", pipeline, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def test_trainyard_run_skips_a_missing_day_and_goes_on(env) -> None:
    """Found by a cold user: ``trainyard run`` over a range stopped at the first day with
    no file (exit 1, "StepSkipped"), though its DAG runs skip that day and go on."""
    out = _run(env, "--ds", "2026-11-02", "--end-ds", "2026-11-04")
    assert out.returncode == EXIT_OK, out.stderr
    assert "2026-11-02: skipped: " in out.stderr and "2026-11-04: skipped: " in out.stderr
    lines = {line[:14].strip(): line[14:] for line in out.stdout.splitlines()}
    assert lines["validation"] == "passed"
    assert "run cli__2026-11-03__" in lines["pipeline"]
    assert lines["skipped"] == "2026-11-02, 2026-11-04: nothing to stage (source.when_missing)"


def test_trainyard_run_with_every_day_missing_is_skipped(env) -> None:
    out = _run(env, "--ds", "2026-11-04", "--end-ds", "2026-11-05")
    assert out.returncode == EXIT_SKIPPED, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("trainyard run: skipped: 2026-11-04: "), last
    assert "2026-11-05: " in last and "Traceback" not in out.stderr


def test_stage_says_what_it_staged_once(env) -> None:
    """Found by a cold user: each ``stage`` printed its ``staged ...`` line twice."""
    out = _stage(env, "cancer_fail", DAY)
    assert out.returncode == EXIT_OK, out.stderr
    said = [line for line in out.stderr.splitlines() if "staged cancer: snapshot" in line]
    assert len(said) == 1, out.stderr


def _run_range_breaking(
    env: dict[str, str], raw: Path, days: list[str]
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Break the contract in ``days``' files, run 2026-11-01 .. DAY: (the run, its last line).

    The run must exit 3 (days failed on their data).
    """
    for day in days:
        rows = read_csv(raw / f"{day}.csv")
        rows[3]["mean_radius"] = "-7.5"  # the contract says min 0
        write_csv(raw / f"{day}.csv", rows)
    out = _run_pipeline(env, "cancer_fail", "--ds", "2026-11-01", "--end-ds", DAY)
    assert out.returncode == EXIT_DETERMINISTIC, out.stderr
    return out, out.stderr.strip().splitlines()[-1]


def test_trainyard_run_goes_on_past_a_day_whose_data_fails(env, tmp_path: Path) -> None:
    """Found by a cold user: a range stopped at its first rejected day, leaving the days
    after it unstaged, though a backfill's runs fail alone. Here the first and the last
    day break the contract: the middle one is staged and validated, nothing trains (the
    last day's run would), and the exit names both days."""
    raw = tmp_path / "raw"
    write_days(raw, ["2026-11-01", "2026-11-02"])
    out, last = _run_range_breaking(env, raw, ["2026-11-01", DAY])
    assert last.startswith("trainyard run: DaysFailed: 2 day(s) failed on their data, nothing"), (
        last
    )
    assert "2026-11-01: ValidationFailed: " in last and f"{DAY}: ValidationFailed: " in last
    assert "2026-11-02: failed" not in out.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "trainyard", "snapshots", "list", "cancer"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "[2026-11-02" in listed.stdout and "*last validated" in listed.stdout, listed.stdout


def test_a_range_goes_on_past_an_empty_file(env, tmp_path: Path) -> None:
    """Found by a cold user: a 0-byte file (a staging error a retry may fix, exit 1)
    stopped the whole range at its day, so later days never ran and the days that had
    already failed went unnamed. As a backfill's run, the day now fails alone."""
    raw = tmp_path / "raw"
    write_days(raw, ["2026-11-01", "2026-11-02"])
    (raw / "2026-11-02.csv").write_bytes(b"")
    out, last = _run_range_breaking(env, raw, [DAY])
    assert last.startswith("trainyard run: DaysFailed: 2 day(s) failed"), last
    assert "2026-11-02: StagingError: " in last and "source is empty (0 bytes)" in last, last
    assert f"{DAY}: ValidationFailed: " in last, last
    assert "2026-11-01: failed" not in out.stderr


def test_validate_logs_its_table_once(env) -> None:
    """Found by a cold user: ``run`` printed each validation table twice."""
    staged = _stage(env, "cancer_fail", DAY)
    assert staged.returncode == EXIT_OK, staged.stderr
    sid = json.loads(staged.stdout)["snapshot_id"]
    argv = [sys.executable, "-m", "trainyard", "validate", "--pipeline", "cancer_fail"]
    out = subprocess.run(
        [*argv, "--snapshot-id", sid], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == EXIT_OK, out.stderr
    assert out.stderr.count(f"validation of cancer/{sid}:") == 1, out.stderr
    assert f"validation of {sid}:" not in out.stderr


def test_a_day_whose_source_is_refused_leaves_the_training_window(
    volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Found by a new user: a staged and validated day whose file was then edited to hold
    ``abc`` in a number column failed at staging, yet its old snapshot stayed in every
    training window ("trained on 6 snapshots") and ``snapshots list`` did not say. The
    interval's record now says its source was refused; windows and drift baselines leave
    it out until a staging of it succeeds."""
    from trainyard import volumes
    from trainyard.errors import SourceInvalid
    from trainyard.staging import stage
    from trainyard.validation import validate

    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(tmp_path / "contracts"))
    write_contract(tmp_path / "contracts")
    raw = tmp_path / "raw"
    dates = ["2026-11-03", "2026-11-04", "2026-11-05"]
    write_days(raw, dates)
    cfg = PipelineConfig.model_validate(pipeline_dict(raw, training={"window": {"intervals": 7}}))
    sids = {}
    for day in dates:
        sids[day] = stage(cfg, day, day, quiet=True).snapshot_id
        validate(cfg, sids[day], day)

    def window_days() -> list[str]:
        entries = volumes.training_window("cancer", {"intervals": 7}, sids[dates[2]], dates[2])
        return [str(e["interval"][0])[:10] for e in entries]

    assert window_days() == dates
    rows = read_csv(raw / "2026-11-04.csv")
    rows[3]["mean_radius"] = "abc"
    write_csv(raw / "2026-11-04.csv", rows)
    with pytest.raises(SourceInvalid, match="row 5"):
        stage(cfg, "2026-11-04", "2026-11-04", quiet=True)
    assert window_days() == ["2026-11-03", "2026-11-05"]
    assert volumes.drift_baseline("cancer", sids[dates[2]], dates[2]) == sids["2026-11-03"]
    key = volumes.interval_key("2026-11-04", "2026-11-04")
    record = volumes.read_interval("cancer", key)
    assert record["snapshot_id"] == sids["2026-11-04"] and "row 5" in record["refused"]["reason"]
    assert snapshots_cli.cli_main(["list", "cancer"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if sids["2026-11-04"] in x]
    assert " SUPERSEDED: [2026-11-04 .. 2026-11-04)'s source was refused" in line, line
    # a source that is gone afterwards does not bring the old snapshot back
    (raw / "2026-11-04.csv").unlink()
    with pytest.raises(StagingError):
        stage(cfg, "2026-11-04", "2026-11-04", quiet=True)
    assert window_days() == ["2026-11-03", "2026-11-05"]
    # corrected again (the same rows as before): it stages, and is back in the window
    write_days(raw, dates)
    again = stage(cfg, "2026-11-04", "2026-11-04", quiet=True)
    assert again.snapshot_id == sids["2026-11-04"] and "refused" in again.checked
    assert "refused" not in volumes.read_interval("cancer", key)
    assert window_days() == dates


@pytest.mark.parametrize(
    ("window_days", "says"),
    [
        (["2026-11-01", "2026-11-02"], "; the training window left them out)"),
        (["2026-11-01", "2026-11-03"], "; trained on the earlier snapshot of 2026-11-03)"),
    ],
)
def test_the_run_summary_says_whether_failed_days_were_trained_on(
    window_days: list[str], says: str
) -> None:
    from trainyard.runs import format_summary

    window = [{"snapshot_id": f"{i:016x}", "interval": [d, d], "rows": 10}
              for i, d in enumerate(window_days)]  # fmt: skip
    record = {
        "pipeline": "cancer",
        "train": {"version": 2, "attempts": 1, "seconds": 1.0, "window": window},
        "failed_days": {"2026-11-03": "SourceInvalid: row 5"},
    }
    line = next(x for x in format_summary(record).splitlines() if x.startswith("failed"))
    assert line.endswith(says), line


_HOLD_RUN_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, b"pid 4242 since then", 0)
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_cli_run_of_a_pipeline_is_refused_while_one_runs(env, volume_root: Path) -> None:
    """Found by a cold user: two ``trainyard run`` of one pipeline at once both trained, and
    the second's deploy was refused afterwards (its champion had changed): wasted work."""
    lock = volume_root / "_models" / "cancer_fail" / ".run.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_RUN_LOCK, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        argv = [sys.executable, "-m", "trainyard", "run", "--pipeline", "cancer_fail"]
        out = subprocess.run(
            [*argv, "--ds", DAY], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        holder.kill()
        holder.wait(10)
    assert out.returncode == EXIT_FAILED, out.stderr
    assert (
        "pipeline 'cancer_fail' is being run already (pid 4242 since then): wait for it to "
        "end; nothing was run"
    ) in out.stderr
    assert not (volume_root / DATASET / "snapshots").exists()  # nothing staged
