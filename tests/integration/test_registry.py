"""Model registry: numbering, champion pointer, history, concurrency and crash safety."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ports import free_port
from trainyard import registry as registry_mod
from trainyard.cli import main as cli
from trainyard.errors import RegistryError
from trainyard.fsutil import HOST
from trainyard.registry import Registry, snapshots_in_use

SPAWN = mp.get_context("spawn")


def make_model(root: Path, name: str = "model", files: int = 3) -> Path:
    """A SavedModel-shaped directory (the registry copies bytes; it never parses them)."""
    model = root / name
    (model / "variables").mkdir(parents=True, exist_ok=True)
    (model / "saved_model.pb").write_bytes(b"\x08\x01pb-" + name.encode())
    for i in range(files):
        (model / "variables" / f"variables.data-{i:05d}").write_bytes(os.urandom(2048))
    (model / "variables" / "variables.index").write_bytes(b"index")
    return model


def meta(snapshot: str = "snap0001", **extra: Any) -> dict[str, Any]:
    return {
        "dataset": "digits",
        "snapshot_id": snapshot,
        "contract_version": "1.0.0",
        "config_hash": "abc123",
        "code_version": "0.1.0+gdeadbeef",
        "image": "local",
        "training": {"epochs": 1},
        "timings": {"train_seconds": 1.5},
        **extra,
    }


def assert_consistent(reg: Registry) -> None:
    """Every visible version is complete and the pointer names one of them (or none)."""
    for v in reg.list_versions():
        vdir = reg.versions_root / str(v)
        assert (vdir / "metadata.json").is_file(), f"version {v} lacks metadata.json"
        assert (vdir / "model" / "saved_model.pb").is_file(), f"version {v} lacks its model"
        assert (vdir / "metrics.json").is_file()
        assert reg.metadata(v)["version"] == v
    champion = reg.champion()
    assert champion is None or champion in reg.list_versions()


@pytest.fixture
def reg(volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """digits' registry in a fresh volume, served on a port of its own: a promotion here
    must not meet the model server ``make run`` left on the shipped port."""
    shipped = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "digits.yaml"
    config = yaml.safe_load(shipped.read_text())
    config["serving"]["port"] = free_port()
    pipelines = tmp_path / "digits-pipelines"
    pipelines.mkdir()
    (pipelines / "digits.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    return Registry(volume_root / "_models", "digits")


def test_register_publishes_complete_numbered_versions(reg: Registry, tmp_path: Path) -> None:
    model = make_model(tmp_path)
    (tmp_path / "metrics.json").write_text('{"accuracy": 0.93}')
    (tmp_path / "history.json").write_text('{"loss": [1.0, 0.5]}')
    v1 = reg.register(
        model, meta(), extra_files=[tmp_path / "metrics.json", tmp_path / "history.json"]
    )
    v2 = reg.register(model, meta("snap0002", train_metrics={"accuracy": 0.5}))
    assert (v1, v2) == (1, 2)
    assert reg.list_versions() == [1, 2]
    d1 = reg.version_dir(1)
    assert sorted(p.name for p in d1.iterdir()) == [
        "history.json",
        "metadata.json",
        "metrics.json",
        "model",
    ]
    assert (d1 / "model" / "saved_model.pb").read_bytes() == (model / "saved_model.pb").read_bytes()
    assert json.loads((d1 / "metrics.json").read_text()) == {"accuracy": 0.93}
    assert reg.read_file(2, "metrics.json") == {"accuracy": 0.5}
    m = reg.metadata(1)
    assert (m["version"], m["pipeline"], m["snapshot_id"], m["config_hash"]) == (
        1,
        "digits",
        "snap0001",
        "abc123",
    )
    assert "registered_at" in m
    assert list((reg.root / ".tmp").iterdir()) == []
    assert reg.champion() is None
    assert reg.snapshot_ids_in_use() == {("digits", "snap0001"), ("digits", "snap0002")}
    assert snapshots_in_use(reg.root.parent) == {("digits", "snap0001"), ("digits", "snap0002")}
    assert_consistent(reg)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("no saved_model.pb", "not a SavedModel"),
        ("metadata without snapshot", "lacks snapshot_id"),
        ("missing extra file", "does not exist"),
        ("reserved extra name", "reserved"),
        ("NaN in metadata", "not plain JSON"),
    ],
    ids=lambda x: str(x).replace(" ", "-"),
)
def test_register_rejects_bad_input_without_publishing(
    reg: Registry, tmp_path: Path, case: str, match: str
) -> None:
    model = make_model(tmp_path)
    metadata, extra = meta(), []
    if case == "no saved_model.pb":
        (model / "saved_model.pb").unlink()
    elif case == "metadata without snapshot":
        metadata.pop("snapshot_id")
    elif case == "missing extra file":
        extra = [tmp_path / "nope.json"]
    elif case == "reserved extra name":
        (tmp_path / "gate.json").write_text("{}")
        extra = [tmp_path / "gate.json"]
    elif case == "NaN in metadata":
        metadata["timings"] = {"train_seconds": float("nan")}
    with pytest.raises(RegistryError, match=match):
        reg.register(model, metadata, extra_files=extra)
    assert reg.list_versions() == []


def test_promote_rollback_and_history(reg: Registry, tmp_path: Path) -> None:
    model = make_model(tmp_path)
    for i in range(3):
        reg.register(model, meta(f"snap{i}"))
    reg.promote(1, "first model", "alice")
    reg.promote(2, "better", "pipeline")
    reg.promote(3, "better again", "pipeline")
    assert reg.champion() == 3
    assert reg.champion_state()["previous"] == [1, 2]
    assert reg.snapshot_ids_in_use(live_only=True) == {("digits", f"snap{i}") for i in range(3)}
    assert reg.rollback("smoke test failed", "deploy") == 2
    assert reg.rollback("bad again", "bob") == 1
    assert reg.snapshot_ids_in_use(live_only=True) == {("digits", "snap0")}
    with pytest.raises(
        RegistryError, match="first champion of 'digits': rolling it back leaves no model"
    ):
        reg.rollback("first one bad too", "bob")
    assert reg.champion() == 1
    assert reg.rollback("first one bad too", "bob", unserve=True) is None
    assert reg.champion() is None
    with pytest.raises(RegistryError, match="no champion to roll back"):
        reg.rollback("again", "bob")
    events = reg.history()
    assert [(e["event"], e["version"], e["from"]) for e in events] == [
        ("promote", 1, None),
        ("promote", 2, 1),
        ("promote", 3, 2),
        ("rollback", 2, 3),
        ("rollback", 1, 2),
        ("rollback", None, 1),
    ]
    assert events[0]["actor"] == "alice" and events[0]["reason"] == "first model"
    assert all(e["at"] and e["id"] for e in events)


@pytest.mark.parametrize(
    ("pointer", "match"),
    [
        ("{not json", "unreadable champion pointer"),
        ('{"version": "two"}', "malformed champion pointer"),
        ('{"version": 7, "previous": []}', "names version 7, which is missing"),
    ],
    ids=["corrupt json", "wrong type", "missing version"],
)
def test_unreadable_champion_raises(
    reg: Registry, tmp_path: Path, pointer: str, match: str
) -> None:
    reg.register(make_model(tmp_path), meta())
    reg.pointer.write_text(pointer)
    with pytest.raises(RegistryError, match=match):
        reg.champion()


@pytest.mark.parametrize(
    ("problem", "match"),
    [
        (lambda r: r.promote(9, "x", "a"), "has no version 9"),
        (lambda r: r.promote(1, " ", "a"), "non-empty"),
    ],
    ids=["unknown version", "blank reason"],
)
def test_promote_bad_requests(reg: Registry, tmp_path: Path, problem: Any, match: str) -> None:
    reg.register(make_model(tmp_path), meta())
    with pytest.raises(RegistryError, match=match):
        problem(reg)
    assert reg.champion() is None


def test_gate_verdict_guards_promotion(reg: Registry, tmp_path: Path) -> None:
    model = make_model(tmp_path)
    reg.register(model, meta())
    reg.register(model, meta())
    reg.attach(1, "gate.json", json.dumps({"verdict": "reject", "reason": "accuracy below 0.85"}))
    with pytest.raises(RegistryError, match=r"rejected by its gate \(accuracy below 0.85\)"):
        reg.promote(1, "try", "alice")
    reg.promote(1, "override after review", "alice", forced=True)
    force = {"actor": "bob", "reason": "hotfix", "at": "2026-11-20T10:00:00Z"}
    reg.attach(2, "gate.json", json.dumps({"verdict": "forced", "force": force}))
    reg.promote(2, "deployed", "pipeline")
    last = reg.history()[-1]
    assert last["forced"] is True and last["force_request"] == force
    with pytest.raises(RegistryError, match="cannot attach"):
        reg.attach(2, "metadata.json", "{}")
    assert reg.history()[0]["forced"] is True  # v1 over its rejecting gate
    # found by a cold user: --force over a gate that passed was recorded as forced
    reg.register(model, meta())
    reg.attach(3, "gate.json", json.dumps({"verdict": "promote", "reason": "checks passed"}))
    reg.promote(3, "by hand", "alice", forced=True)
    assert reg.history()[-1]["forced"] is False


# ---------------------------------------------------------------- real processes


def _register_and_promote(models_root: str, model: str, worker: int) -> None:
    reg = Registry(models_root, "digits")
    version = reg.register(Path(model), meta(f"snap-w{worker}", worker=worker))
    reg.promote(version, f"worker {worker}", f"w{worker}")


def test_concurrent_register_and_promote_real_processes(reg: Registry, tmp_path: Path) -> None:
    model = make_model(tmp_path, files=20)
    n = 6
    procs = [
        SPAWN.Process(target=_register_and_promote, args=(str(reg.root.parent), str(model), i))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * n
    assert reg.list_versions() == list(range(1, n + 1))
    assert sorted(reg.metadata(v)["worker"] for v in range(1, n + 1)) == list(range(n))
    state = reg.champion_state()
    assert sorted([state["version"], *state["previous"]]) == list(range(1, n + 1))
    events = reg.history()
    assert len(events) == n and len({e["id"] for e in events}) == n
    # the history chains: each promotion replaced the one recorded before it
    assert [e["from"] for e in events] == [None] + [e["version"] for e in events[:-1]]
    assert events[-1]["version"] == reg.champion()
    assert_consistent(reg)


def _crash_child(models_root: str, model: str, where: str) -> None:
    """Register (and promote) with ``os._exit`` injected at one point: a hard crash."""
    reg = Registry(models_root, "digits")

    def die(*_: Any, **__: Any) -> None:
        os._exit(17)

    if where == "mid-copy":
        real_copytree = registry_mod.shutil.copytree

        def copy_half_then_die(src: Path, dst: Path, **_: Any) -> None:
            registry_mod.shutil.copytree = real_copytree  # its recursion calls the global name
            real_copytree(src, dst, ignore=lambda _d, names: [n for n in names if "data-0" in n])
            die()

        registry_mod.shutil.copytree = copy_half_then_die
    elif where == "before-publish":
        registry_mod.publish_dir = die
    elif where == "before-pointer":
        registry_mod.atomic_write_json = die
    elif where == "before-history":
        Registry._append_history = die  # type: ignore[method-assign]
    version = reg.register(Path(model), meta("snap-crash"))
    reg.promote(version, "crash test", "child")
    os._exit(0)


@pytest.mark.parametrize(
    ("where", "versions", "champion", "history_after"),
    [
        ("mid-copy", [1], 1, 1),
        ("before-publish", [1], 1, 1),
        ("before-pointer", [1, 2], 1, 1),
        ("before-history", [1, 2], 2, 2),
    ],
    ids=[
        "crash mid-copy",
        "crash before publish",
        "crash between version and pointer",
        "crash after pointer",
    ],
)
def test_crash_never_exposes_incomplete_version(
    reg: Registry,
    tmp_path: Path,
    where: str,
    versions: list[int],
    champion: int,
    history_after: int,
) -> None:
    model = make_model(tmp_path, files=5)
    reg.register(model, meta())
    reg.promote(1, "baseline", "alice")
    child = SPAWN.Process(target=_crash_child, args=(str(reg.root.parent), str(model), where))
    child.start()
    child.join(120)
    assert child.exitcode == 17
    assert reg.list_versions() == versions
    assert reg.champion() == champion
    assert_consistent(reg)
    # the next writer cleans the dead child's private copy, numbers on, and the history
    # gains the event a crash lost after the pointer moved
    nxt = reg.register(model, meta("snap-next"))
    assert nxt == versions[-1] + 1
    assert [p.name for p in (reg.root / ".tmp").iterdir()] == []
    events = reg.history()
    assert len(events) == history_after
    assert events[-1]["version"] == champion


_LOOP = """
import sys
sys.path.insert(0, {plugins!r})
from pathlib import Path
from trainyard.registry import Registry
reg = Registry({root!r}, "digits")
while True:
    v = reg.register(Path({model!r}), {{"dataset": "digits", "snapshot_id": "s"}})
    reg.promote(v, "loop", "killer-test")
    if v % 3 == 0:
        reg.rollback("loop", "killer-test")
    print(v, flush=True)
"""


def test_sigkill_at_random_points_keeps_registry_consistent(reg: Registry, tmp_path: Path) -> None:
    model = make_model(tmp_path, files=30)
    plugins = str(Path(registry_mod.__file__).resolve().parents[1])
    code = _LOOP.format(plugins=plugins, root=str(reg.root.parent), model=str(model))
    for delay in (0.35, 0.6, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # at least one full round done: the killing is mid-work
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert_consistent(reg)
        reg.history()  # every line parses
    assert len(reg.list_versions()) >= 3


def test_cli_list_show_promote_rollback(
    reg: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model(tmp_path)
    reg.register(model, meta("snapA", train_metrics={"accuracy": 0.9}))
    reg.register(model, meta("snapB", train_metrics={"accuracy": 0.95}))
    assert (
        cli(
            ["models", "promote", "--pipeline", "digits", "1", "--reason", "first", "--actor", "al"]
        )
        == 0
    )
    assert cli(["models", "promote", "--pipeline", "digits", "2", "--reason", "better"]) == 0
    capsys.readouterr()
    assert cli(["models", "list", "--pipeline", "digits"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["version", "registered", "snapshot", "gate", "metrics"]
    assert out[2].startswith("*") and "snapB" in out[2] and "accuracy=0.9500" in out[2]
    assert cli(["models", "show", "--pipeline", "digits"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (
        shown["version"] == 2 and shown["champion"] and shown["metadata"]["snapshot_id"] == "snapB"
    )
    assert cli(["models", "rollback", "--pipeline", "digits", "--reason", "regression"]) == 0
    assert "champion is now 1" in capsys.readouterr().out
    assert cli(["models", "rollback", "--pipeline", "digits", "--reason", "bad too"]) == 3
    assert "--unserve to take the model offline" in capsys.readouterr().err
    # a version that is not there, or no reason, is a usage error: no retry fixes it
    for argv in (
        ["show", "--pipeline", "digits", "9"],
        ["promote", "--pipeline", "digits", "9", "--reason", "x"],
        ["rollback", "--pipeline", "digits", "--reason", " "],
        ["rollback", "--pipeline", "digits", "--reason", "x" * 2001],
    ):
        with pytest.raises(SystemExit) as exc:
            cli(["models", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert (
            "has no version 9 (known: 1, 2)" in err
            or "--reason must say why" in err
            or "--reason is 2001 characters: a reason is a sentence or a few (at most 2000)" in err
        )
    assert cli(["models", "history", "--pipeline", "digits"]) == 0
    assert [json.loads(line)["event"] for line in capsys.readouterr().out.splitlines()] == [
        "promote",
        "promote",
        "rollback",
    ]


def test_register_survives_a_corrupt_pointer_and_fills_code_version(
    reg: Registry, tmp_path: Path
) -> None:
    model = make_model(tmp_path)
    reg.register(model, meta())
    reg.pointer.write_text("{corrupt")
    metadata = meta()
    metadata.pop("code_version")
    assert reg.register(model, metadata) == 2
    sha = reg.metadata(2)["code_version"]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", sha), sha
    with pytest.raises(RegistryError, match="unreadable champion pointer"):
        reg.promote(2, "needs a readable pointer", "alice")


def test_code_version_outside_git_is_the_package_version(tmp_path: Path) -> None:
    assert registry_mod.code_version(tmp_path) == "trainyard 0.1.0"


@pytest.mark.parametrize(
    ("name", "age_s", "kept"),
    [
        ("reg-otherhost-1-abc123", 60, True),
        ("reg-otherhost-1-abc123", 3 * 24 * 3600, False),
        ("reg-{host}-{live}-abc123", 3 * 24 * 3600, True),
        ("reg-{host}-999999999-abc123", 0, False),
        ("not-ours", 3 * 24 * 3600, True),
    ],
    ids=[
        "other pod fresh",
        "other pod old",
        "live local writer",
        "dead local writer",
        "foreign name",
    ],
)
def test_stale_private_copies_are_cleaned(
    reg: Registry, tmp_path: Path, name: str, age_s: float, kept: bool
) -> None:
    leftover = reg.root / ".tmp" / name.format(host=HOST, live=os.getpid())
    (leftover / "model").mkdir(parents=True)
    then = time.time() - age_s
    os.utime(leftover, (then, then))
    reg.register(make_model(tmp_path), meta())
    assert leftover.exists() is kept


def test_a_promote_serving_could_not_follow_moves_nothing(
    reg: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # A cold user's rollback printed "champion is now none", then failed on the config:
    # the registry moved while serving stayed. The config is now checked first.
    model = make_model(tmp_path)
    reg.register(model, meta("snapA"))
    reg.register(model, meta("snapB"))
    reg.promote(1, "first", "al")
    folder = tmp_path / "pipelines"
    folder.mkdir()
    text = (Path(__file__).parents[2] / "dags" / "pipelines" / "digits.yaml").read_text()
    (folder / "digits.yaml").write_text(text)
    (folder / "a_digits.yaml").write_text(text.replace("name: digits\n", "name: a_digits\n", 1))
    Registry(reg.root.parent, "a_digits").register(model, meta("snapC"))  # it ran too
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    for argv in (["promote", "--pipeline", "digits", "2"], ["rollback", "--pipeline", "digits"]):
        assert cli(["models", *argv, "--reason", "x"]) == 3
        assert "is also the serving.model_name of pipeline 'a_digits'" in capsys.readouterr().err
        assert reg.champion() == 1 and [e["event"] for e in reg.history()] == ["promote"]


def test_a_refusal_is_not_retried() -> None:
    # deploy --version 99 and a promote of a rejected version exited 1, "a retry may fix"
    from trainyard.errors import RegistryRefused
    from trainyard.steps import deterministic

    assert deterministic(RegistryRefused("pipeline 'digits' has no version 99"))
    assert not deterministic(RegistryError("version 3 appeared while the lock was held"))


def test_cli_approve_only_for_pipelines_that_ask_for_approval(
    reg: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``models approve`` on a pipeline whose gate alone decides was recorded (and meant
    nothing); it is refused, and ``--force`` belongs to ``promote`` alone."""
    import yaml

    from trainyard.settings import get_settings

    reg.register(make_model(tmp_path), meta("snapA"))
    approve = ["models", "approve", "--pipeline", "digits", "1", "--reason", "looks right"]
    assert cli(approve) == 3
    assert "does not ask for approval (gate.approval: none)" in capsys.readouterr().err
    assert reg.history() == [] and reg.read_file(1, "approval.json") is None
    with pytest.raises(SystemExit):
        cli([*approve, "--force"])
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    doc = yaml.safe_load((get_settings().pipelines_dir / "digits.yaml").read_text())
    doc.setdefault("gate", {})["approval"] = "required"
    doc["gate"]["approvers"] = {"users": ["carol"]}
    (pipelines / "digits.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    monkeypatch.setenv("USER", "carol")
    assert cli(approve) == 0
    assert "version 1 approved by carol" in capsys.readouterr().out
    assert reg.read_file(1, "approval.json")["approved"] is True


def test_checkpoints_of_runs_nobody_retried_for_a_week_are_removed(tmp_path: Path) -> None:
    """A killed training run's checkpoints stayed on the volume forever; registering a
    version removes those untouched for :data:`STALE_RUN_DAYS`, and only those."""
    from trainyard.steps import STALE_RUN_DAYS, remove_stale_runs

    runs = tmp_path / "_checkpoints" / "digits"
    week_ago = time.time() - (STALE_RUN_DAYS + 1) * 86400

    def run(name: str, recent: str | None = None) -> Path:
        folder = runs / name
        (folder / "backup" / "chief").mkdir(parents=True)
        (folder / "backup" / "chief" / "ckpt-3.index").write_bytes(b"x")
        for d, _, files in os.walk(folder):
            for f in [*files, "."]:
                os.utime(Path(d) / f, (week_ago, week_ago))
        if recent:  # written now, deep inside: a run still training
            (folder / "backup" / "chief" / recent).write_bytes(b"y")
        return folder

    killed = run("manual__killed")
    training = run("manual__training", recent="ckpt-4.index")
    fresh = runs / "manual__fresh"
    fresh.mkdir()
    (runs / "not-a-run.txt").write_text("kept")
    assert remove_stale_runs(runs) == [killed]
    assert not killed.exists() and training.is_dir() and fresh.is_dir()
    assert (runs / "not-a-run.txt").is_file()
    assert remove_stale_runs(tmp_path / "missing") == []


def _gated(reg: Registry, version: int, champion: int | None) -> None:
    """``gate.json`` as the evaluate step writes it (a second cold user found the deploy
    check reading a key only the step's XCom result has: every second run failed)."""
    from trainyard.evaluation.gate import GateDecision

    decision = GateDecision(
        True, "promote", "checks passed", [], champion is None, version=version,
        champion_version=champion,
    )  # fmt: skip
    for name, data in decision.report_files().items():
        reg.attach(version, name, data.decode())


def test_the_deploy_step_never_demotes_a_champion_its_gate_did_not_see(reg: Registry, tmp_path):
    """Found by a cold user: ``deploy --version 1`` made v1 (gated when nothing was
    champion) the champion over v3, without force or reason; evaluating the champion
    overwrote the gate record of its promotion with a comparison with itself."""
    from trainyard import steps
    from trainyard.errors import DeployError

    for _ in range(3):
        reg.register(make_model(tmp_path), meta())
    _gated(reg, 1, None)
    _gated(reg, 2, 1)
    _gated(reg, 3, 1)
    reg.promote(1, "first", "al")
    reg.promote(3, "better", "al")
    history = reg.history()
    reg.register(make_model(tmp_path), meta())
    _gated(reg, 4, 3)  # the next candidate, gated against today's champion: it may ship
    for ok in (3, 4):  # and the champion itself (a redeploy)
        gate = reg.read_file(ok, "gate.json")
        steps.ensure_gated_against_champion("digits", reg.champion(), ok, gate)
    for old, seen in ((1, "none"), (2, "version 1")):
        why = f"version {old} was gated against champion {seen} and the champion is now version 3"
        with pytest.raises(DeployError, match=why + ": evaluate it again"):
            steps.deploy("digits", old)
    assert reg.champion() == 3 and reg.history() == history
    gate = reg.read_file(3, "gate.json")
    # the champion as a candidate (a run that reused it) is kept, never re-gated over its
    # own record of what it beat when it shipped
    kept = steps.evaluate("digits", 3)
    assert (kept["verdict"], kept["promote"], kept["champion"]) == ("keep", False, 3)
    assert "Version 3 is the champion and keeps serving: nothing to deploy" in kept["reason"]
    assert reg.read_file(3, "gate.json") == gate


def test_cli_promote_of_the_champion_records_nothing_and_unknown_pipelines_are_named(
    reg: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a cold user: promoting the champion again added a promotion "from 7 to
    7"; ``models history --pipeline nope`` printed nothing and exited 0."""
    reg.register(make_model(tmp_path), meta())
    promote = ["models", "promote", "--pipeline", "digits", "1", "--reason", "first"]
    assert cli(promote) == 0 and cli(promote) == 0
    assert "version 1 already is the champion" in capsys.readouterr().out
    assert [e["event"] for e in reg.history()] == ["promote"]
    for action in ("history", "show", "list"):
        with pytest.raises(SystemExit) as exc:
            cli(["models", action, "--pipeline", "nope"])
        assert exc.value.code == 2
        assert "unknown pipeline 'nope': no config in " in capsys.readouterr().err


def test_a_pipeline_whose_config_is_gone_keeps_its_registry_readable_but_nothing_moves(
    reg: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``models rollback`` of a pipeline whose YAML was deleted said "unknown pipeline
    'digits' (known: none)", though ``models list`` showed its champion."""
    reg.register(make_model(tmp_path), meta())
    reg.promote(1, "first", "tests")
    (tmp_path / "digits-pipelines" / "digits.yaml").unlink()
    assert cli(["models", "list", "--pipeline", "digits"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("*  1 ")
    moves = (
        ["rollback", "--unserve", "--reason", "retired"],
        ["promote", "1", "--reason", "again"],
        ["serve"],
    )
    for move in moves:
        assert cli(["models", move[0], "--pipeline", "digits", *move[1:]]) == 3
        err = capsys.readouterr().err
        assert "RegistryRefused: pipeline 'digits' has no config in " in err, err
        assert f"put digits.yaml back to {move[0]}" in err
    assert reg.champion() == 1 and [e["event"] for e in reg.history()] == ["promote"]


def test_list_shows_a_version_not_yet_evaluated_by_its_numbers(
    reg: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a cold user: a version from a bare ``train`` listed every training field
    (class names, model, strategy) in its metrics column."""
    figures = {"accuracy": 0.9, "class_names": ["0", "1"], "model": "small_cnn", "epochs": 4}
    reg.register(make_model(tmp_path), meta(train_metrics=figures))
    assert cli(["models", "list", "--pipeline", "digits"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.endswith("accuracy=0.9000 epochs=4"), row


def test_cli_promote_refuses_a_serving_port_held_by_something_else(
    reg: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Found by a cold user: ``models promote`` onto a port something else held moved the
    champion and exited 0 with a warning, leaving the new champion unserved; ``deploy``
    refused the same case."""
    import socket

    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    shipped = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "digits.yaml"
    config = yaml.safe_load(shipped.read_text())
    with socket.socket() as squatter:  # listens, answers nothing: not a model server
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        config["serving"]["port"] = port = squatter.getsockname()[1]
        (pipelines / "digits.yaml").write_text(yaml.safe_dump(config))
        monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
        reg.register(make_model(tmp_path), meta())
        code = cli(["models", "promote", "--pipeline", "digits", "1", "--reason", "first"])
    assert code == 3
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is in use by something that is not a model server: stop" in err
    assert "or give this pipeline another serving.port" in err
    assert reg.champion() is None and reg.history() == []


def test_check_port_is_ours_says_a_free_port_has_no_server(tmp_path: Path) -> None:
    """A free port passes, answering False (``ensure_local_server`` then starts one)."""
    import socket

    from trainyard.serving.deploy import check_port_is_ours

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert check_port_is_ours(tmp_path, "127.0.0.1", port) is False


def test_a_promotion_waits_for_a_deploy_of_the_pipeline(reg: Registry, tmp_path: Path) -> None:
    """Found by a cold user: two runs of one day at once left the registry naming version 6
    and the server serving 4 (a failed deploy restored the champion it had read before the
    other run's promotion). A deploy, promote or rollback now holds the pipeline's deploy
    lock from reading the champion to serving the new one."""
    reg.register(make_model(tmp_path), meta())
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_DEPLOY_LOCK, str(reg.root / ".deploy.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    promote = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        argv = ["models", "promote", "--pipeline", "digits", "1", "--reason", "r"]
        promote = subprocess.Popen(
            [sys.executable, "-m", "trainyard", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)  # the holder lets go after 3 s
        assert promote.poll() is None and reg.champion() is None
        out, err = promote.communicate(timeout=180)
    finally:
        holder.kill()
        holder.wait(10)
        if promote is not None and promote.poll() is None:
            promote.kill()
    assert promote.returncode == 0, err
    assert reg.champion() == 1 and "version 1 is now the champion" in out


_HOLD_DEPLOY_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(3)
"""


def test_models_serve_brings_the_champion_back_after_a_stop(
    reg: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a new user: after ``make stop`` nothing served the champion until the next
    deploy, and no command said how to serve it again."""
    from tests.support.serving import build_image_model
    from trainyard.serving.client import ServingClient
    from trainyard.serving.deploy import stop_local_server
    from trainyard.settings import get_settings

    serve = ["models", "serve", "--pipeline", "digits"]
    reg.register(make_model(tmp_path), meta())
    assert cli(serve) == 3
    assert "RegistryRefused: pipeline 'digits' has no champion to serve" in capsys.readouterr().err
    model = build_image_model(tmp_path / "real", seed=0)
    version = reg.register(model, meta("snapR"))
    assert cli(["models", "promote", "--pipeline", "digits", str(version), "--reason", "x"]) == 0
    port = yaml.safe_load(next(get_settings().pipelines_dir.glob("*.yaml")).read_text())["serving"][
        "port"
    ]
    assert stop_local_server(get_settings().serving_root)  # as make stop does
    capsys.readouterr()
    assert cli(serve) == 0
    said = capsys.readouterr().out
    assert f"digits: serving version {version} (stable) on 127.0.0.1:{port}" in said, said
    with ServingClient("127.0.0.1", port) as client:
        status, body = client.request("GET", "/v1/models/digits")
    assert status == 200 and json.loads(body)["model_version_status"][0]["state"] == "AVAILABLE"
    assert [e["event"] for e in reg.history()] == ["promote"]  # serving moves no champion


def test_list_tells_a_promote_that_was_never_served(
    reg: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a new user: ``models list`` showed gate ``promote`` for versions whose
    deploy was killed, as for the champion."""
    for _ in range(3):
        version = reg.register(make_model(tmp_path), meta())
        reg.attach(version, "gate.json", json.dumps({"verdict": "promote", "reason": "ok"}))
    reg.promote(1, "first", "al")
    reg.promote(3, "better", "al")
    reg.rollback("regression", "al")
    assert cli(["models", "list", "--pipeline", "digits"]) == 0
    rows = {line.lstrip("* ").split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "promote (never served)" in rows["2"]
    assert "promote (never served)" not in rows["1"] + rows["3"]
    assert all(re.search(r" promote( |$)", rows[v]) for v in ("1", "3")), rows
