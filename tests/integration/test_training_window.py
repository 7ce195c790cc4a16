"""Training windows: which snapshots a run trains on, read as one, leased, kept, recorded.

A daily CSV dataset generated in the test (scikit-learn's breast cancer data, one file per
day), really staged and validated into a real volume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.daily_csv import KEY, days, read_csv, write_contract, write_csv, write_days
from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard import volumes
from trainyard.config import PipelineConfig, parse_pipeline
from trainyard.contracts import holdout_mask, load_contract
from trainyard.errors import ConfigError, SnapshotError, ValidationFailed
from trainyard.staging import stage
from trainyard.steps import data_until, window_ids
from trainyard.training.worker.data import load_examples, load_window_examples
from trainyard.validation import validate

DAYS = days("2026-11-01", 5)


def _interval(day: str) -> tuple[str, str]:
    return f"{day}T03:00:00+00:00", f"{day}T03:00:00+00:00".replace(day, _next(day))


def _next(day: str) -> str:
    import datetime as dt

    return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, int]]:
    """Five days staged and validated once, except day 4 whose file breaks the contract."""
    base = tmp_path_factory.mktemp("window")
    raw = base / "raw"
    rows = write_days(raw, DAYS)
    write_contract(base / "contracts")
    bad = read_csv(raw / f"{DAYS[3]}.csv")
    bad[0]["mean_area"] = "-1"
    write_csv(raw / f"{DAYS[3]}.csv", bad)
    cfg = PipelineConfig.model_validate(pipeline_dict(raw))
    ids = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINYARD_CONTRACTS_DIR", str(base / "contracts"))
        mp.setenv("TRAINYARD_VOLUME_ROOT", str(base / "volumes"))
        for day in DAYS:
            ids[day] = stage(cfg, *_interval(day), quiet=True).snapshot_id
            if day == DAYS[3]:
                with pytest.raises(ValidationFailed):
                    validate(cfg, ids[day])
            else:
                validate(cfg, ids[day])
    return base, ids, rows


@pytest.fixture
def staged(
    built, tmp_path: Path, volume_root: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[PipelineConfig, dict[str, str], dict[str, int]]:
    """A private copy of the five days' volume (and raw files) for one test."""
    import shutil

    base, ids, rows = built
    shutil.copytree(base / "volumes", volume_root, dirs_exist_ok=True)
    shutil.copytree(base / "raw", tmp_path / "raw")
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(base / "contracts"))
    return PipelineConfig.model_validate(pipeline_dict(tmp_path / "raw")), ids, rows


def _window(ids: dict[str, str], window, as_of: str, own: str | None = None) -> list[str]:
    own = own or ids[as_of]
    entries = volumes.training_window("cancer", window, own, _interval(as_of)[0])
    return [e["snapshot_id"] for e in entries]


def test_windows_select_validated_intervals_up_to_the_run(staged) -> None:
    _, ids, rows = staged
    d = DAYS
    assert _window(ids, "newest", d[4]) == [ids[d[4]]]
    # the rejected day 4 is left out; the window counts validated intervals
    assert _window(ids, {"intervals": 3}, d[4]) == [ids[d[1]], ids[d[2]], ids[d[4]]]
    assert _window(ids, {"intervals": 30}, d[4]) == [ids[x] for x in (d[0], d[1], d[2], d[4])]
    assert _window(ids, {"intervals": 4}, d[4]) == [ids[x] for x in (d[0], d[1], d[2], d[4])]
    assert _window(ids, {"intervals": 5}, d[4]) == [ids[x] for x in (d[0], d[1], d[2], d[4])]
    assert _window(ids, {"since": d[2]}, d[4]) == [ids[d[2]], ids[d[4]]]
    assert _window(ids, {"intervals": 1}, d[4]) == [ids[d[4]]]
    # an old day's run: the window ends at its interval
    assert _window(ids, {"intervals": 30}, d[1]) == [ids[d[0]], ids[d[1]]]
    entries = volumes.training_window("cancer", {"intervals": 30}, ids[d[4]], _interval(d[4])[0])
    assert [e["rows"] for e in entries] == [rows[x] for x in (d[0], d[1], d[2], d[4])]
    assert entries[-1]["interval"] == list(_interval(d[4]))
    assert all(e["dataset"] == "cancer" for e in entries)
    # the pipeline's own window through the validate step's resolution
    from trainyard.config import WindowIntervals

    assert WindowIntervals(intervals=2).model_dump() == {"intervals": 2}


def test_the_same_content_on_two_days_counts_once(staged, tmp_path: Path) -> None:
    cfg, ids, _ = staged
    raw = tmp_path / "raw"
    day6 = _next(DAYS[4])
    (raw / f"{day6}.csv").write_bytes((raw / f"{DAYS[4]}.csv").read_bytes())
    same = stage(cfg, *_interval(day6), quiet=True)
    assert same.snapshot_id == ids[DAYS[4]] and same.reused
    got = volumes.training_window("cancer", {"intervals": 3}, same.snapshot_id, _interval(day6)[0])
    assert [e["snapshot_id"] for e in got] == [ids[DAYS[1]], ids[DAYS[2]], ids[DAYS[4]]]
    assert got[-1]["interval"][0].startswith(day6)


def test_union_of_a_window_keeps_each_snapshots_holdout(staged) -> None:
    _, ids, rows = staged
    contract = load_contract("cancer")
    dirs = [volumes.snapshot_dir("cancer", ids[d]) for d in (DAYS[0], DAYS[1], DAYS[2])]
    train = load_window_examples(dirs, contract, "train")
    hold = load_window_examples(dirs, contract, "holdout")
    total = sum(rows[d] for d in DAYS[:3])
    assert len(train) + len(hold) == total > max(rows.values())
    assert not set(train.keys) & set(hold.keys)
    assert hold.keys == [k for d in dirs for k in load_examples(d, contract, "holdout").keys]
    assert holdout_mask(hold.keys, 0.2).all() and not holdout_mask(train.keys, 0.2).any()
    assert train.features["mean_radius"].shape == (len(train),)
    assert set(np.unique(train.labels)) == {0, 1}


def test_leases_cover_the_whole_window(staged) -> None:
    _, ids, _ = staged
    window = [ids[d] for d in (DAYS[0], DAYS[1], DAYS[4])]
    with volumes.lease_window("cancer", window, purpose="train r"):
        leased = volumes.active_leases("cancer")
        assert set(leased) == set(window)
        # retention keeping 1 snapshot must keep every leased one
        deleted = volumes.gc_snapshots("cancer", 1)
        assert not set(deleted) & set(window)
        assert ids[DAYS[2]] in deleted  # neither leased, newest nor latest validated
    assert volumes.active_leases("cancer") == {}
    with (
        pytest.raises(SnapshotError, match="no such snapshot"),
        volumes.lease_window("cancer", [ids[DAYS[0]], ids[DAYS[2]]]),
    ):
        pass
    assert volumes.active_leases("cancer") == {}  # the first one was released again


def test_retention_keeps_every_snapshot_a_model_was_trained_on(staged, volume_root: Path) -> None:
    _, ids, _ = staged
    window = [ids[d] for d in (DAYS[0], DAYS[1], DAYS[4])]
    meta = volume_root / "_models" / "cancer" / "versions" / "1" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(
        json.dumps(
            {
                "dataset": "cancer",
                "snapshot_id": window[-1],
                "snapshots": [{"dataset": "cancer", "snapshot_id": s} for s in window],
            }
        )
    )
    keep = volumes.protected_snapshots("cancer")
    assert set(window) <= set(keep)
    assert "window" in keep[window[0]]
    deleted = volumes.gc_snapshots("cancer", 1)
    assert not set(deleted) & set(window)
    from trainyard.registry import Registry

    assert {s for _, s in Registry(volume_root / "_models", "cancer").snapshot_ids_in_use()} == set(
        window
    )


def test_window_config_forms_and_one_clear_error(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for window, expect in (
        ("newest", "newest"),
        ({"intervals": 30}, {"intervals": 30}),
        ({"since": "2026-11-01"}, {"since": "2026-11-01"}),
    ):
        cfg = PipelineConfig.model_validate(pipeline_dict(raw, training={"window": window}))
        assert cfg.training.model_dump()["window"] == expect
    for bad, says in (
        ({"intervals": 0}, "intervals must be an integer from 1"),
        ({"since": "last week"}, "since must be a date"),
        ("everything", "must be 'newest', {intervals: N} or {since: YYYY-MM-DD}"),
        ({"intervals": 3, "since": "2026-11-01"}, "must be 'newest'"),
    ):
        path = tmp_path / "cancer.yaml"
        path.write_text(json.dumps(pipeline_dict(raw, training={"window": bad})))
        with pytest.raises(ConfigError) as err:
            parse_pipeline(path)
        text = str(err.value)
        assert "training.window" in text and says in text
        assert text.count("\n") == 1  # one line naming the file, one naming the field


def test_window_ids_and_data_until() -> None:
    assert window_ids("c" * 16, None) == ["c" * 16]
    assert window_ids("c" * 16, [{"snapshot_id": "a" * 16}, {"snapshot_id": "c" * 16}]) == [
        "a" * 16,
        "c" * 16,
    ]
    with pytest.raises(ConfigError, match="names no snapshot id"):
        window_ids("c" * 16, [{"rows": 3}])
    read = [
        {"snapshot_id": "a", "interval": ["2026-11-03T03:00:00+00:00", None]},
        {"snapshot_id": "b", "interval": ["2026-11-01T03:00:00+00:00", None]},
        {"snapshot_id": "c", "interval": None, "created_at": "2026-10-01T00:00:00+00:00"},
    ]
    assert data_until(read) == "2026-11-03T03:00:00+00:00"
    assert data_until([]) is None


def test_validate_step_returns_the_window(staged, tmp_path: Path) -> None:
    _, ids, rows = staged
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    spec = pipeline_dict(tmp_path / "raw", training={"window": {"intervals": 5}})
    (pipelines / "cancer.yaml").write_text(json.dumps(spec))
    os.environ["TRAINYARD_PIPELINES_DIR"] = str(pipelines)
    try:
        from trainyard.steps import validate as validate_step

        out = validate_step("cancer", ids[DAYS[4]], _interval(DAYS[4])[0])
        got = [e["snapshot_id"] for e in out["window"]]
        assert got == [ids[d] for d in (DAYS[0], DAYS[1], DAYS[2], DAYS[4])]
        assert sum(e["rows"] for e in out["window"]) > max(rows.values())
        # no interval (a snapshot given by the run): the snapshot alone
        alone = validate_step("cancer", ids[DAYS[1]])
        assert [e["snapshot_id"] for e in alone["window"]] == [ids[DAYS[1]]]
    finally:
        del os.environ["TRAINYARD_PIPELINES_DIR"]
    assert KEY == "row_id"


def test_the_tf_input_reads_the_union_of_the_window(staged) -> None:
    """The worker's tf.data input over three snapshots: every train row of each, once."""
    from trainyard.training.worker.input import SnapshotInput

    _, ids, _ = staged
    contract = load_contract("cancer")
    dirs = [volumes.snapshot_dir("cancer", ids[d]) for d in (DAYS[0], DAYS[1], DAYS[4])]
    expected = load_window_examples(dirs, contract, "train")
    for in_graph in (False, True):
        inp = SnapshotInput(dirs, contract, "train", in_graph=in_graph)
        assert inp.spec.num_examples == len(expected)
        assert inp.spec.outputs == 2
        ds = inp.dataset(64, shuffle=False, repeat=False, drop_remainder=False)
        labels = np.concatenate([y.numpy() for _, y in ds])
        radius = np.concatenate([x["mean_radius"].numpy() for x, _ in ds])
        assert len(labels) == len(expected)
        np.testing.assert_array_equal(labels, expected.labels)
        np.testing.assert_allclose(radius, expected.features["mean_radius"])
    single = SnapshotInput(dirs[-1], contract, "train")
    assert single.spec.num_examples < inp.spec.num_examples


def test_the_run_summary_says_what_the_model_trained_on() -> None:
    from trainyard.runs import format_summary

    window = [{"snapshot_id": "a", "rows": 114}, {"snapshot_id": "b", "rows": 113}]
    record = {
        "pipeline": "cancer",
        "run_id": "r",
        "validate": {"success": True, "window": window},
        "register": {"version": 3, "attempts": 1, "seconds": 2.0},
    }
    lines = format_summary(record).splitlines()
    assert lines[3] == "training      version 3, attempts 1, 2.0 s"
    assert lines[4] == "data          trained on 227 rows from 2 snapshots"
    record["validate"]["window"] = [
        {**w, "interval": [f"2026-11-0{i + 1}", None]} for i, w in enumerate(window)
    ]
    assert (
        format_summary(record).splitlines()[4].endswith("227 rows from 2 intervals 2026-11-01..02")
    )
    # found by a new user: a day of a range that did not train read "version -, attempts
    # -, -, on 2 snapshots (227 rows)"
    del record["register"]
    record["validate"]["window"] = window
    line = format_summary(record).splitlines()[3]
    assert line == "training      not run: this run did not train (backfill_training, or a dry run)"


@pytest.mark.parametrize(("window", "kept"), [({"intervals": 5}, 5), ("newest", 2)])
def test_retention_keeps_the_window_a_backfill_will_train_on(
    tmp_path: Path, volume_root: Path, monkeypatch: pytest.MonkeyPatch, window, kept: int
) -> None:
    raw = tmp_path / "raw"
    write_days(raw, DAYS)
    write_contract(tmp_path / "contracts")
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(tmp_path / "contracts"))
    spec = pipeline_dict(raw, staging={"retention": 2}, training={"window": window})
    cfg = PipelineConfig.model_validate(spec)
    ids = []
    for day in DAYS:
        ids.append(stage(cfg, *_interval(day), quiet=True).snapshot_id)
        validate(cfg, ids[-1])
    on_disk = {p.name for p in (volume_root / "cancer" / "snapshots").iterdir()}
    assert len(on_disk & set(ids)) == kept
    got = volumes.training_window("cancer", window, ids[-1], _interval(DAYS[-1])[0])
    assert len(got) == (5 if window != "newest" else 1)


def test_models_list_shows_how_many_more_snapshots_a_version_read(
    volume_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainyard.registry import Registry, cli_main

    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"\x08\x01pb")
    reg = Registry(volume_root / "_models", "cancer")
    window = [{"dataset": "cancer", "snapshot_id": f"{i:016x}", "rows": 114} for i in range(5)]
    reg.register(model, {"dataset": "cancer", "snapshot_id": window[-1]["snapshot_id"]})
    reg.register(
        model,
        {"dataset": "cancer", "snapshot_id": window[-1]["snapshot_id"], "snapshots": window},
    )
    assert cli_main(["list", "--pipeline", "cancer"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[2] == window[-1]["snapshot_id"]  # one snapshot: no count
    assert f"{window[-1]['snapshot_id']} +4" in rows[2]


def test_retention_keeps_what_another_pipelines_window_reads(
    tmp_path: Path, volume_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pipelines on one dataset: ``nightly`` stages with retention 1, ``weekly`` trains on
    the last 3 days. ``nightly``'s retention (and ``snapshots gc``) deleted days ``weekly``'s
    window still covered, and ``weekly`` trained on fewer days, naming none. Retention now
    knows every reader, and a window with a hole names each missing day and fails."""
    from trainyard.steps import validate as validate_step

    raw = tmp_path / "raw"
    write_days(raw, DAYS[:3])
    write_contract(tmp_path / "contracts")
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(tmp_path / "contracts"))
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    nightly = pipeline_dict(  # its own window the newest day (the default is the last 30)
        raw, name="nightly", staging={"retention": 1}, training={"window": {"intervals": 1}}
    )
    weekly = pipeline_dict(raw, name="weekly", training={"window": {"intervals": 3}})
    weekly["serving"] = {"model_name": "weekly"}
    for spec in (nightly, weekly):
        (pipelines / f"{spec['name']}.yaml").write_text(json.dumps(spec))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    cfg = parse_pipeline(pipelines / "nightly.yaml")
    ids = []
    for day in DAYS[:3]:
        ids.append(stage(cfg, *_interval(day), quiet=True).snapshot_id)
        validate(cfg, ids[-1])
    on_disk = {p.name for p in (volume_root / "cancer" / "snapshots").iterdir()}
    assert set(ids) <= on_disk  # nightly's retention 1 kept weekly's three days
    protected = volumes.protected_snapshots("cancer")
    assert protected[ids[0]] == "training window of pipeline weekly"
    assert volumes.gc_snapshots("cancer", 1) == []

    # a day deleted by hand: the window names it and trains nothing
    import shutil

    shutil.rmtree(volume_root / "cancer" / "snapshots" / ids[0])
    with pytest.raises(SnapshotError, match=f"lacks 1 interval\\(s\\): {DAYS[0]}: its snapshot"):
        validate_step("weekly", ids[2], _interval(DAYS[2])[0])
    # the pipeline says to train on what is left: it does, and says which day it lacks
    weekly["training"]["window_gaps"] = "train"
    (pipelines / "weekly.yaml").write_text(json.dumps(weekly))
    out = validate_step("weekly", ids[2], _interval(DAYS[2])[0])
    assert [e["snapshot_id"] for e in out["window"]] == [ids[1], ids[2]]
    assert out["lacks"] == [_interval(DAYS[0])[0]]
    from trainyard.runs import format_summary

    lines = format_summary({"pipeline": "weekly", "validate": out}).splitlines()
    assert any(line.startswith(f"lacks         {DAYS[0]}:") for line in lines)


def test_a_pipeline_config_that_does_not_load_stops_retention(
    staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "broken.yaml").write_text("name: broken\ndataset: [\n")
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    before = {m.snapshot_id for m in volumes.list_snapshots("cancer")}
    with pytest.raises(SnapshotError, match=r"broken\.yaml: a pipeline config that does not load"):
        volumes.gc_snapshots("cancer", 1)
    assert {m.snapshot_id for m in volumes.list_snapshots("cancer")} == before
