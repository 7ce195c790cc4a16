"""The UI plugin's pages and file route, on real files: what a run did, read from the volume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainyard import runview
from trainyard.layout import run_key
from trainyard.orchestration.ui import confined_file

SNAP = "88fa3acafa0854bd"
RUN = "manual__2026-11-24T10:00:00+00:00"


def _write(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """A volume with one snapshot (a failed warning rule) and two versions, v1 champion."""
    root = tmp_path / "volumes"
    snap = root / "digits" / "snapshots" / SNAP
    _write(
        snap / "manifest.json",
        {
            "rows": 1797,
            "bytes": 10,
            "interval": {"start": "2026-11-24", "end": "2026-11-24"},
            "shards": [{"role": "data"}, {"role": "index"}],
        },
    )
    rule = {"rule": "in_set", "column": "label", "severity": "warning", "success": False}
    rule |= {"unexpected_count": 2, "samples": ["<script>alert(1)</script>"], "reason": "x"}
    rule |= {"rows": [17, 42]}
    drift = [
        {"rule": "drift:psi", "column": "label", "success": True, "observed": 0.01},
        {"rule": "drift:ks", "column": "width", "success": False, "observed": 0.4},
    ]
    _write(
        snap / "validation" / "summary.json",
        {
            "success": True,
            "rows": 1797,
            "batches": 1,
            "rules": [rule, *drift],
            "warnings": ["x"],
            "previous_snapshot_id": "0123456789abcdef",
        },
    )
    _write(snap / "validation" / "data_docs" / "index.html", "<html>docs</html>")
    models = root / "_models" / "digits"
    for v, verdict in ((1, "promote"), (2, "reject")):
        vdir = models / "versions" / str(v)
        meta = {"dataset": "digits", "snapshot_id": SNAP, "run_id": f"run{v}"}
        _write(vdir / "metadata.json", meta | {"registered_at": f"2026-11-2{v}"})
        _write(
            vdir / "metrics.json",
            {"accuracy": 0.9, "loss": 0.3, "model": "small_cnn", "class_names": ["cat", "<b>"]},
        )
        _write(
            vdir / "history.json",
            {"epochs": [{"epoch": 0, "loss": 1.5, "accuracy": 0.5}, {"epoch": 1, "loss": 0.3}]},
        )
        _write(
            vdir / "gate.json",
            {
                "verdict": verdict,
                "reason": f"{verdict} because accuracy",
                "version": v,
                "candidate_metrics": {"accuracy": 0.9 - v / 10, "loss": 0.3},
                "champion_metrics": {"accuracy": 0.8, "loss": 0.3} if v == 2 else None,
                "champion_version": 1 if v == 2 else None,
                "diagnostics": {"kind": "confusion", "classes": 2, "matrix": [[8, 2], [1, 9]]},
            },
        )
    event = {"event": "promote", "version": 1, "from": None, "at": "t", "actor": "a"}
    _write(models / "champion.json", {"version": 1, "previous": [], "event": event})
    _write(models / "history.jsonl", json.dumps(event) + "\n")
    return root


def test_run_story_and_page_show_what_the_run_did(volume: Path) -> None:
    story = runview.run_story(volume, "digits", "run2")
    assert story["version"]["version"] == 2 and story["gate"]["verdict"] == "reject"
    assert story["snapshot"]["shards"] == 1 and story["snapshot"]["data_docs"] is True
    page = runview.render_run(story, "/docs/index.html", "/pipe")
    assert 'class="gate-reason">reject because accuracy<' in page
    assert "champion v1" in page and "candidate v2" in page
    assert "<svg" in page and "<polyline" in page
    assert 'href="/docs/index.html"' in page
    assert "<script>" not in page and "&lt;script&gt;" in page  # data is escaped
    assert "row 17, row 42" in page  # sample rows of the failed rule (a report without keys)
    assert "drift per column vs snapshot 0123456789abcdef" in page
    assert page.count("<rect") == 2 and 'fill="#dc2626"' in page  # the failing drift in red
    # found by a new user: the training figures ran off the page's right edge as one wide
    # row; they are a column now, and any wide table scrolls
    figures = page.split('class="train-metrics"', 1)[1].split("</table>", 1)[0]
    assert "<th>training figure</th><th>value</th>" in figures and "<td>accuracy</td>" in figures
    assert page.count('<div class="tw"><table') == page.count("<table")
    # the confusion matrix, rows true and columns predicted, named by the classes
    assert '<table class="confusion">' in page and "<th>cat</th>" in page
    assert "<th>&lt;b&gt;</th>" in page and ">8</td>" in page and "0.9000" in page  # recall


def test_a_regressors_run_page_draws_its_residuals(volume: Path) -> None:
    gate_path = volume / "_models" / "digits" / "versions" / "2" / "gate.json"
    gate = json.loads(gate_path.read_text())
    gate["diagnostics"] = {
        "kind": "residuals",
        "edges": [-2.0, -1.0, 0.0, 1.0, 2.0],
        "counts": [1, 5, 7, 2],
        "mean": 0.1,
        "std": 0.9,
        "p05": -1.5,
        "p50": 0.0,
        "p95": 1.7,
        "n": 15,
    }
    gate_path.write_text(json.dumps(gate))
    page = runview.render_run(runview.run_story(volume, "digits", "run2"), None, "/pipe")
    assert "residuals (prediction - target) of 15 holdout rows" in page
    assert page.count("<rect") == 2 + 4 and "-1 … 0" in page
    assert "&lt; -1" in page and "≥ 1" in page  # the outer bins hold the tails
    assert "p95 1.7000" in page and 'class="confusion"' not in page


def test_pipeline_page_lists_versions_champion_and_history(volume: Path) -> None:
    story = runview.pipeline_story(volume, "digits")
    page = runview.render_pipeline(story, lambda r: f"/runs/{r}")
    assert [v["version"] for v in story["versions"]] == [1, 2]
    assert "champion" in page and "<svg" in page and 'href="/runs/run1"' in page
    assert "serving now: <b" in page


def test_unknown_runs_and_foreign_dags_are_one_clear_not_found(volume: Path) -> None:
    with pytest.raises(runview.NotFound, match="no record of run"):
        runview.run_story(volume, "digits", RUN)
    with pytest.raises(runview.NotFound, match="not a trainyard pipeline"):
        runview.pipeline_of("example_bash_operator")
    with pytest.raises(runview.NotFound, match="not a safe name"):
        runview.pipeline_of("trainyard_..")


def test_summary_line_says_snapshot_metrics_decision_and_serving() -> None:
    stage = {"snapshot_id": SNAP, "reused": True, "rows": 1797}
    ev = {"verdict": "reject", "reason": "accuracy 0.1 < 0.85", "champion": 1}
    ev |= {"metrics": {"accuracy": 0.1, "loss": 2.3}}
    line = runview.summary_line(
        {"stage": stage, "validate": {"success": True}, "register": {"version": 2}, "evaluate": ev}
    )
    assert line == (
        f"snapshot {SNAP} (reused, 1797 rows) · validation passed · v2 accuracy=0.1000, "
        "loss=2.3000 · gate reject: accuracy 0.1 < 0.85 · serving unchanged (v1)"
    )
    stopped = runview.summary_line({"stage": stage}, failed=["validate"])
    assert stopped == (
        f"snapshot {SNAP} (reused, 1797 rows) · validation failed · gate not run · "
        "serving unchanged · failed: validate (no reason recorded: see the task's log)"
    )  # a cold user marked a run failed and read "failed: train", with no cause
    long = runview.summary_line({"evaluate": {"verdict": "reject", "reason": "x" * 5000}})
    assert len(long) == runview.NOTE_MAX and "\n" not in long
    # found by a cold user: a dry run's note read like a run whose gate never ran
    dry = runview.summary_line({"stage": stage, "validate": {"success": True}}, dry_run=True)
    assert dry == (
        f"snapshot {SNAP} (reused, 1797 rows) · validation passed · dry run: stopped before "
        "training (its plan is in the train task's log) · serving unchanged"
    )


def test_line_chart_draws_series_and_says_when_empty() -> None:
    svg = runview.line_chart("loss", {"loss": [(1, 0.5), (2, float("nan")), (3, 0.2)]}, "epoch")
    assert svg.startswith("<svg") and svg.count("<circle") == 2
    assert "nothing recorded" in runview.line_chart("loss", {"loss": []})


def test_confined_file_serves_only_regular_files_inside_the_report(tmp_path: Path) -> None:
    root = tmp_path / "volumes"
    base = root / "digits" / "snapshots" / SNAP / "validation"
    _write(base / "data_docs" / "index.html", "<html/>")
    _write(base.parent / "manifest.json", {})
    _write(tmp_path / "secret.json", {})
    _write(base / "tool.exe", "x")
    os.symlink(tmp_path / "secret.json", base / "out_of_root.json")
    os.symlink(base.parent / "manifest.json", base / "out_of_report.json")
    os.symlink(base / "data_docs" / "index.html", base / "alias.html")

    assert confined_file(root, base, "data_docs/index.html") == base / "data_docs" / "index.html"
    assert confined_file(root, base, "alias.html") == base / "data_docs" / "index.html"
    for bad in (
        "",
        "/etc/passwd",
        "../manifest.json",
        "data_docs/../../manifest.json",
        "data_docs//index.html",
        "./data_docs/index.html",
        "out_of_root.json",
        "out_of_report.json",
        "data_docs",
        "tool.exe",
        "missing.html",
        "data_docs\\index.html",
    ):
        with pytest.raises(FileNotFoundError):
            confined_file(root, base, bad)


def test_a_report_folder_linked_out_of_the_volume_serves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "volumes"
    elsewhere = tmp_path / "elsewhere"
    _write(elsewhere / "data_docs" / "index.html", "<html/>")
    snap = root / "digits" / "snapshots" / SNAP
    snap.mkdir(parents=True)
    os.symlink(elsewhere, snap / "validation")
    with pytest.raises(FileNotFoundError):
        confined_file(root, snap / "validation", "data_docs/index.html")


def test_a_run_stopped_by_validation_shows_the_rejection_from_its_results(volume: Path) -> None:
    bad = "badbadbadbadbad1"
    snap = volume / "digits" / "snapshots" / bad
    _write(snap / "manifest.json", {"rows": 5, "shards": [{"role": "data"}]})
    rule = {"rule": "row_count", "column": None, "severity": "error", "success": False}
    rule |= {"unexpected_count": None, "samples": [], "reason": "5 rows < 1000"}
    summary = {"success": False, "rows": 5, "batches": 1, "rules": [rule], "warnings": []}
    _write(snap / "validation" / "summary.json", summary)
    _write(snap / "validation" / "rejected.json", summary)
    story = runview.run_story(
        volume, "digits", RUN, {"stage": {"snapshot_id": bad, "reused": False, "rows": 5}}
    )
    assert story["summarised"] is False and story["version"] is None
    assert story["snapshot"]["rejected"] is True
    page = runview.render_run(story, None, "/pipe")
    assert "REJECTED" in page and "5 rows &lt; 1000" in page and "row_count" in page
    assert "not summarised" in page and "the gate did not run" in page
    # found by a new user: with no earlier interval the page said nothing of drift
    assert "drift: not measured: no validated snapshot of an earlier interval" in page
    # found by a new user: a failed run's page said "still running, or stopped before its
    # summary"; the plugin adds what Airflow knows of the run
    failed = {**story, "airflow_state": "failed", "failed": ["validate"]}
    said = runview.render_run({**failed, "failure": "1 rule failed: row_count"}, None, "/pipe")
    assert "not summarised (the run failed at validate: 1 rule failed: row_count)" in said
    said = runview.render_run(failed, None, "/pipe")
    assert "failed at validate: no reason recorded: see the task&#39;s log" in said
    said = runview.render_run({**story, "airflow_state": "running"}, None, "/pipe")
    assert "not summarised (the run is running)" in said


def test_the_summary_line_says_who_approved_or_rejected() -> None:
    results = {
        "evaluate": {"verdict": "promote", "reason": "All checks passed.", "champion": 1},
        "approve": {"approved": False, "by": "admin", "reason": "wait for the relabelled batch"},
    }
    line = runview.summary_line(results)
    assert "rejected by admin: wait for the relabelled batch" in line
    assert "serving unchanged (v1)" in line


def test_an_unknown_pipeline_is_named_without_server_paths(volume: Path) -> None:
    """Found by a cold user: ``/trainyard/runs/trainyard_nope/x`` said "pipeline 'nope'
    has no record of run 'x'", and the pipelines page's 404 named the server's folder."""
    for call in (
        lambda: runview.run_story(volume, "nope", "x"),
        lambda: runview.pipeline_story(volume, "nope"),
    ):
        with pytest.raises(runview.NotFound) as e:
            call()
        assert str(e.value) == "unknown pipeline 'nope'"


def test_a_run_that_recorded_nothing_gets_a_page_saying_where_it_failed() -> None:
    """Found by a cold user: a run that failed at ``stage`` showed raw JSON saying it had
    no record "yet"."""
    page = runview.render_unrecorded("digits", "manual__<x>", "failed", ["stage"])
    assert "run manual__&lt;x&gt;" in page and "state: <b>failed</b>" in page
    assert "It failed at stage before any step recorded a result" in page
    told = runview.render_unrecorded("digits", "r", "failed", ["stage"], "no <such> snapshot")
    assert "before any step recorded a result: no &lt;such&gt; snapshot" in told
    line = runview.summary_line({}, ["stage"], reason="no such snapshot")
    assert line.endswith("failed: stage (no such snapshot)"), line
    running = runview.render_unrecorded("digits", "r", "running", [])
    assert "No step has recorded a result yet." in running


def test_a_forced_gate_says_forced_once(volume: Path) -> None:
    """Found by a cold user: the gate line read "decision: forced (forced)"."""
    gate = volume / "_models" / "digits" / "versions" / "2" / "gate.json"
    doc = json.loads(gate.read_text())
    doc |= {"verdict": "forced", "force": {"actor": "al", "reason": "hotfix", "at": "t"}}
    gate.write_text(json.dumps(doc))
    page = runview.render_run(runview.run_story(volume, "digits", "run2"), None, "/p")
    assert "(forced)" not in page and "(force requested)" not in page


def test_a_page_of_something_unknown_is_a_page() -> None:
    page = runview.render_not_found("pipeline 'd' has no record of run '<x>': no such run")
    assert page.startswith("<!doctype html>") and "&lt;x&gt;" in page


def test_a_version_trained_on_a_window_says_so(volume: Path) -> None:
    """Found by a cold user: a version trained on three days' snapshots said "trained on
    snapshot <the run's>"."""
    meta_path = volume / "_models" / "digits" / "versions" / "2" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    window = [
        {"snapshot_id": "00000000000000a1", "rows": 600, "interval": ["2026-11-22", "2026-11-23"]},
        {"snapshot_id": "00000000000000a2", "rows": 465, "interval": ["2026-11-23", "2026-11-24"]},
        {"snapshot_id": SNAP, "rows": 400, "interval": None},
    ]
    _write(meta_path, meta | {"snapshots": window})
    page = runview.render_run(runview.run_story(volume, "digits", "run2"), None, "/p")
    said = "trained on 1465 rows from 3 snapshots (intervals 2026-11-22..23)"
    assert f"{said}, this run's <code>{SNAP}</code> last" in page
    assert 'title="00000000000000a1 [2026-11-22 .. 2026-11-23), 00000000000000a2' in page
    one = runview.render_run(runview.run_story(volume, "digits", "run1"), None, "/p")
    assert f"snapshot <code>{SNAP}</code>" in one and "trained on " in one


@pytest.mark.browser
def test_chart_labels_are_drawn_whole_in_a_browser() -> None:
    """Found by a cold user: the drift chart cut a label's first letter ("emperature
    (mean_shift)"). Every label of the chart must lie inside it, in a real browser."""
    from playwright.sync_api import sync_playwright

    from tests.support.harness import BROWSER_ARGS, CHROMIUM

    labels = ["temperature (mean_shift)", "x (psi)", "a_much_longer_column_name_for_sensors (ks)"]
    labels.append("WIDE_UPPER_CASE_ÜNÏCÖDÉ_MW (psi)")
    labels.append("w" * 80 + " (std_shift)")  # shortened, whole in its tooltip
    svg = runview.bar_chart("drift", [(label, 0.5, True) for label in labels])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page()
        page.set_content(f"<html><style>{runview.CSS}</style><body>{svg}</body></html>")
        width = page.eval_on_selector("svg", "s => s.viewBox.baseVal.width")
        boxes = page.eval_on_selector_all(
            "svg text.tick", "ts => ts.map(t => { const b = t.getBBox(); return [b.x, b.width] })"
        )
        browser.close()
    assert len(boxes) == 2 * len(labels)  # a label and a value per bar
    for x, w in boxes:
        assert x >= 0 and x + w <= width, (x, w, width)
    assert "w" * 47 + "…" in svg and "w" * 80 + " (std_shift): 0.5" in svg


def test_a_persons_rejection_shows_on_the_run_page_and_in_the_history() -> None:
    """Found by a new user: a run whose approval a person rejected read "decision: promote,
    this run deployed nothing", and its history row said "approval" as for an approval."""
    story = {
        "pipeline": "digits",
        "run_id": RUN,
        "summarised": True,
        "record": {"approve": {"approved": False, "by": "admin", "reason": "not <today>"}},
        "gate": {"verdict": "promote", "reason": "All checks passed."},
        "history": [
            {"event": "approval", "approved": True, "version": 5, "actor": "admin"},
            {"event": "approval", "approved": False, "version": 6, "actor": "admin"},
        ],
    }
    page = runview.render_run(story, None, "/pipe")
    assert (
        'approval: <span class="bad decision">rejected</span> by admin: not &lt;today&gt;' in page
    )
    rows = page.split('class="history"', 1)[1]
    assert rows.index("rejected") < rows.index("approved")  # newest first
    story["record"] = {"approve": {"approved": None}}
    assert "approval: waiting for a person" in runview.render_run(story, None, "/pipe")


def test_a_failed_dry_run_does_not_point_at_a_plan_it_never_made() -> None:
    """Found by a new user: a dry run that failed at stage said its plan was in the train
    task's log."""
    line = runview.summary_line({}, failed=["stage"], dry_run=True, reason="bad conf")
    assert "its plan" not in line and "dry run" in line and "failed: stage (bad conf)" in line


def test_the_pipeline_page_says_when_the_champion_is_not_served(
    volume: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a cold user: after ``make stop`` the page said "serving now: version 1"
    from the registry while no model server ran. The page asks the server (a real HTTP
    server here, answering as TF Serving does) before it says what is served."""
    import http.server
    import socket
    import threading

    import yaml

    from trainyard.serving.status import server_answer

    available: list[int] = []

    class Serving(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = [{"version": str(v), "state": "AVAILABLE"} for v in available]
            body = json.dumps({"model_version_status": status}).encode()
            self.send_response(200 if self.path == "/v1/models/digits" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Serving)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "dags" / "pipelines" / "digits.yaml").read_text())
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    monkeypatch.delenv("TRAINYARD_RUNNER", raising=False)
    monkeypatch.setattr("trainyard.serving.status.ANSWER_TTL_S", 0.0)  # every view asks

    def page(port: int) -> str:
        raw["serving"]["port"] = port
        (pipelines / "digits.yaml").write_text(yaml.safe_dump(raw))
        story = {**runview.pipeline_story(volume, "digits"), "server": server_answer("digits")}
        return runview.render_pipeline(story, lambda r: f"/runs/{r}")

    try:
        available[:] = [1]
        said = page(server.server_address[1])
        assert "serving now: <b" in said and "(answering at 127.0.0.1:" in said
        available[:] = [2]
        said = page(server.server_address[1])
        assert "not served" in said and "serves version(s) 2 of it, not the champion" in said
    finally:
        server.shutdown()
        server.server_close()
    said = page(closed)
    assert "serving now" not in said and "not served" in said
    assert f"127.0.0.1:{closed}</code> does not answer" in said
    assert "models serve --pipeline digits" in said


def test_a_run_that_reused_a_version_says_so_and_what_it_saw(volume: Path) -> None:
    """Issue 38: a run on unchanged inputs trains nothing; its page and its note say so,
    and what the model was trained on (rows, intervals), as the summary does."""
    window = [
        {"snapshot_id": SNAP, "rows": 1797, "interval": ["2026-11-24", "2026-11-25"]},
    ]
    decision = "unchanged since version 1 (same snapshot, config, code): reused, 0 s"
    register = {"version": 1, "reused": True, "decision": decision, "window": window}
    record = {
        "pipeline": "digits",
        "run_id": "run3",
        "finished_at": "2026-11-25T02:10:00+00:00",
        "stage": {"snapshot_id": SNAP, "reused": True, "rows": 1797},
        "validate": {"success": True, "window": window},
        "register": register,
        "evaluate": {"verdict": "keep", "reason": "Version 1 is the champion", "champion": 1},
    }
    meta_path = volume / "_models/digits/versions/1/metadata.json"
    _write(meta_path, json.loads(meta_path.read_text()) | {"snapshots": window, "rows": 1797})
    _write(volume / "_models/digits/runs" / f"{run_key('run3')}.json", record)
    page = runview.render_run(runview.run_story(volume, "digits", "run3"), None, "/p")
    assert f"this run trained nothing: {decision}" in page
    assert "trained on 1797 rows from 1 interval 2026-11-24" in page
    note = runview.summary_line(record)
    assert "v1 reused (same inputs)" in note
    assert "trained on 1797 rows from 1 interval 2026-11-24" in note
    assert "gate keep: Version 1 is the champion" in note
