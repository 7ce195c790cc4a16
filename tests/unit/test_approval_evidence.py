"""An approval is evidence only as the registry holds it, written from Airflow's own record.

The bypass this guards against: after a person rejected a candidate, an account with
Airflow's ordinary user role edited the ``approve`` task's XComs (its skip marker and its
``by``) and cleared ``deploy``, which shipped the rejected version "approved by" the
person who had rejected it. Now ``deploy`` takes no approval argument at all and reads
the registry's ``approval.json``, which only the ``approval`` step writes; who may answer
is the pipeline's ``gate.approvers`` (four-eyes by default).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from trainyard.config import ApproversConfig, PipelineConfig
from trainyard.errors import ConfigError, DeployError, RegistryRefused
from trainyard.registry import Registry


def _model(root: Path) -> Path:
    model = root / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"pb")
    (model / "variables" / "variables.index").write_bytes(os.urandom(64))
    return model


@pytest.fixture
def project(volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """digits asking for approval, with version 1 gated ``promote`` against no champion."""
    shipped = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "digits.yaml"
    doc = yaml.safe_load(shipped.read_text())
    doc["gate"] |= {"approval": "required", "approvers": {"users": ["alice"]}}
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "digits.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    PipelineConfig.model_validate(doc)  # the config itself is valid
    reg = Registry(volume_root / "_models", "digits")
    reg.register(
        _model(tmp_path),
        {"dataset": "digits", "snapshot_id": "s1", "training": {}, "timings": {}},
    )
    gate = {"verdict": "promote", "reason": "thresholds passed", "champion_version": None}
    reg.attach(1, "gate.json", json.dumps(gate))
    return reg


@pytest.mark.parametrize(
    ("case", "approvers", "triggerer", "users", "expected"),
    [
        ("users only", {"users": ["alice", "bob"]}, None, [], ["alice", "bob"]),
        ("roles expand", {"roles": ["op"]}, None, [("al", "op"), ("vi", "viewer")], ["al"]),
        ("role names ignore case", {"roles": ["OP"]}, None, [("al", "op")], ["al"]),
        ("both", {"users": ["bob"], "roles": ["admin"]}, None, [("root", "admin")],
         ["bob", "root"]),
        ("four eyes", {"users": ["alice", "bob"]}, "alice", [], ["bob"]),
        ("triggerer allowed", {"users": ["alice"], "allow_triggerer": True}, "alice", [],
         ["alice"]),
    ],
)  # fmt: skip
def test_who_may_answer(
    case: str,
    approvers: dict,
    triggerer: str | None,
    users: list[tuple[str, str]],
    expected: list[str],
) -> None:
    from trainyard.orchestration.approval import allowed_approvers

    got = allowed_approvers(ApproversConfig.model_validate(approvers), triggerer, users)
    assert got == expected, case


def test_nobody_left_to_answer_is_said_not_guessed() -> None:
    from trainyard.orchestration.approval import allowed_approvers

    with pytest.raises(ConfigError, match="alice triggered the run and may not approve it"):
        allowed_approvers(ApproversConfig(users=["alice"]), "alice", [])
    with pytest.raises(ConfigError, match="nobody may answer"):
        allowed_approvers(ApproversConfig(roles=["op"]), None, [("bob", "user")])


def test_a_pipeline_asking_approval_must_name_its_approvers() -> None:
    from trainyard.config import GateConfig

    with pytest.raises(ValueError, match="approval: required needs approvers"):
        GateConfig(approval="required")
    with pytest.raises(ValueError, match="approval: required needs approvers"):
        GateConfig(approval="required", approvers={"users": []})


def test_deploy_takes_no_approval_from_its_caller() -> None:
    """The XCom edit's way in: deploy had ``--approved-by`` fed from the approve XCom."""
    from trainyard.steps import STEPS

    assert {a.name for a in STEPS["deploy"].args} == {"pipeline", "version", "actor"}
    with pytest.raises(SystemExit):
        STEPS["deploy"].parse(["--pipeline", "digits", "--version", "1", "--approved-by", "x"])


def test_deploy_ships_only_what_the_registry_says_was_approved(project: Registry) -> None:
    from trainyard import steps

    with pytest.raises(DeployError, match="nobody has approved it"):
        steps.deploy("digits", 1)
    steps.approval("digits", 1, "rejected", by="alice", reason="wait for relabel")
    with pytest.raises(DeployError, match="alice rejected it: wait for relabel"):
        steps.deploy("digits", 1)
    # approved, then asked again (approve cleared): the earlier answer no longer counts
    steps.approval("digits", 1, "approved", by="alice", reason="ok")
    steps.approval("digits", 1, "pending", reason="asked: alice")
    with pytest.raises(DeployError, match="waits for an answer"):
        steps.deploy("digits", 1)
    assert project.champion() is None
    events = [(e["event"], e["approved"], e["actor"]) for e in project.history()]
    assert events == [
        ("approval", False, "alice"),
        ("approval", True, "alice"),
        ("approval", None, "nobody yet"),
    ]


def test_a_rejection_of_the_served_version_rolls_it_back(project: Registry) -> None:
    """``approve`` cleared after the version shipped, then answered Reject: registry and
    serving must not disagree with the answer."""
    from trainyard import steps

    steps.approval("digits", 1, "approved", by="alice", reason="ok")
    project.promote(1, reason="approved by alice: ok", actor="alice")
    out = steps.approval("digits", 1, "rejected", by="alice", reason="mislabelled after all")
    assert out["rolled_back"] is True
    assert project.champion() is None
    last = project.history()[-1]
    assert (last["event"], last["from"], last["version"]) == ("rollback", 1, None)
    assert last["reason"] == "rejected by alice after it shipped: mislabelled after all"
    models_config = project.root.parent.parent / "_serving" / "models.config"
    assert "digits" not in models_config.read_text()


def test_an_unknown_decision_or_a_pipeline_without_approval_is_refused(
    project: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard import steps

    with pytest.raises(ConfigError, match="expected one of pending, approved, rejected"):
        steps.approval("digits", 1, "yes")
    shipped = Path(__file__).resolve().parents[2] / "dags" / "pipelines"
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(shipped))
    with pytest.raises(RegistryRefused, match="does not ask for approval"):
        steps.approval("digits", 1, "approved", by="alice")
    assert project.read_file(1, "approval.json") is None
