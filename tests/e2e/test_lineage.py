"""OpenLineage from a real run: the provider's file transport, the spec's JSON schema.

``apache-airflow-providers-openlineage`` (its listener, in the real ``airflow dags test``
of the digits DAG) writes every event of the run through its ``file`` transport. Each
event is validated against the OpenLineage JSON schema (``schemas/openlineage``: the
spec's ``OpenLineage.json`` 2-0-2 and its facet schemas, offline) and every facet against
the schema its ``_schemaURL`` names (the spec's, or the provider's Airflow facets). The
lineage graph snapshot → model version → served version is then rebuilt from the events
alone, and its facets are checked against what the run wrote to the volume.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tests.support.digits_run import OL_NAMESPACE, DigitsRun
from tests.support.harness import (
    ROOT,
    Project,
    init_airflow,
    make_project,
    openlineage_to_file,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC = Path(__file__).parent / "schemas" / "openlineage"
SPEC_EVENT = "https://openlineage.io/spec/2-0-2/OpenLineage.json"
DAG_ID = "trainyard_digits"


def _airflow_facets_dir() -> Path:
    import airflow.providers.openlineage as provider

    return Path(provider.__file__).parent / "facets"


def _registry() -> tuple[Registry, dict[str, Any]]:
    """The spec's schemas by ``$id``, and the provider's Airflow facet schemas by file name."""
    resources = []
    for path in [SPEC / "OpenLineage.json", *sorted((SPEC / "facets").glob("*.json"))]:
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    airflow = {
        p.name: json.loads(p.read_text()) for p in sorted(_airflow_facets_dir().glob("*.json"))
    }
    return Registry().with_resources(resources), airflow


def _facet_validator(registry: Registry, airflow: dict[str, Any], url: str) -> Any:
    """A validator for the schema a facet's ``_schemaURL`` points at (None: unknown)."""
    base, _, pointer = url.partition("#")
    try:
        registry.get_or_retrieve(base)
    except Exception:
        name = base.rsplit("/", 1)[-1]
        if "apache/airflow" not in base or name not in airflow:
            return None
        schema = {"$ref": f"#{pointer}", **airflow[name]}
        return Draft202012Validator(schema, registry=registry)
    return Draft202012Validator({"$ref": url}, registry=registry)


def _facets(event: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every facet of an event: (where, key, facet)."""
    for key, facet in (event.get("run", {}).get("facets") or {}).items():
        yield "run", key, facet
    for key, facet in (event.get("job", {}).get("facets") or {}).items():
        yield "job", key, facet
    for side in ("inputs", "outputs"):
        for ds in event.get(side) or []:
            for key, facet in (ds.get("facets") or {}).items():
                yield f"{side}:{ds['name']}", key, facet
            for group in ("inputFacets", "outputFacets"):
                for key, facet in (ds.get(group) or {}).items():
                    yield f"{side}:{ds['name']}:{group}", key, facet


def _lineage_project(tmp: Path, overrides: dict[str, Any]) -> tuple[Project, Path]:
    """A project whose Airflow writes OpenLineage events to a file (the provider's transport)."""
    project = make_project(tmp, overrides)
    return project, openlineage_to_file(project, OL_NAMESPACE)


def _read_events(events_file: Path) -> list[dict[str, Any]]:
    assert events_file.is_file(), "the provider wrote no OpenLineage event"
    return [json.loads(line) for line in events_file.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def run(digits_run: DigitsRun) -> dict[str, Any]:
    """The shared real run of the digits DAG (tests/e2e/conftest.py), whose project has the
    provider's file transport on and whose gate passed (a served version exists)."""
    out = digits_run.out
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert digits_run.events, "the provider wrote no OpenLineage event"
    return {"events": digits_run.events, "project": digits_run.project, "last": digits_run.last}


def _task_events(events: list[dict[str, Any]], task: str, kind: str) -> list[dict[str, Any]]:
    name = f"{DAG_ID}.{task}"
    return [e for e in events if e["job"]["name"] == name and e.get("eventType") == kind]


def _one_complete(events: list[dict[str, Any]], task: str) -> dict[str, Any]:
    found = _task_events(events, task, "COMPLETE")
    assert len(found) == 1, (task, [(e["job"]["name"], e.get("eventType")) for e in events])
    return found[0]


def _assert_valid(events: list[dict[str, Any]]) -> None:
    """Every event against the spec's schema, every facet against its ``_schemaURL``."""
    assert events
    registry, airflow = _registry()
    event_validator = Draft202012Validator({"$ref": SPEC_EVENT}, registry=registry)
    unknown = set()
    for event in events:
        errors = sorted(event_validator.iter_errors(event), key=lambda e: list(e.path))
        assert not errors, (event["job"]["name"], [e.message for e in errors][:5])
        # formats the validator does not check without extra packages
        uuid.UUID(event["run"]["runId"])
        dt.datetime.fromisoformat(event["eventTime"])
        assert event["job"]["namespace"] == OL_NAMESPACE
        for where, key, facet in _facets(event):
            validator = _facet_validator(registry, airflow, facet["_schemaURL"])
            if validator is None:
                unknown.add((key, facet["_schemaURL"]))
                continue
            errors = list(validator.iter_errors(facet))
            assert not errors, (event["job"]["name"], where, key, [e.message for e in errors])
    assert not unknown, f"facets whose schema is neither the spec's nor the provider's: {unknown}"


def test_every_event_and_facet_is_valid_openlineage(run: dict[str, Any]) -> None:
    events = run["events"]
    _assert_valid(events)
    kinds = {(e["job"]["name"], e.get("eventType")) for e in events}
    for task in ("stage", "validate", "train", "register", "evaluate", "deploy", "summary"):
        assert (f"{DAG_ID}.{task}", "START") in kinds, task
        assert (f"{DAG_ID}.{task}", "COMPLETE") in kinds, task
    # the DAG run's own event (its START comes from the scheduler, which dags test skips)
    assert (DAG_ID, "COMPLETE") in kinds


def test_every_task_event_names_the_dag_run_as_its_parent(run: dict[str, Any]) -> None:
    events = run["events"]
    dag_runs = {e["run"]["runId"] for e in events if e["job"]["name"] == DAG_ID}
    assert len(dag_runs) == 1, dag_runs
    (dag_run,) = dag_runs
    tasks = [e for e in events if e["job"]["name"].startswith(f"{DAG_ID}.")]
    assert tasks
    for event in tasks:
        parent = event["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == dag_run, event["job"]["name"]
        assert (parent["job"]["namespace"], parent["job"]["name"]) == (OL_NAMESPACE, DAG_ID)
        assert parent["root"]["run"]["runId"] == dag_run


def test_snapshot_facets_schema_hash_and_assertions(run: dict[str, Any]) -> None:
    events, project, last = run["events"], run["project"], run["last"]
    sid = last["stage"]["snapshot_id"]
    snapshot_dir = project.volume_root / "digits" / "snapshots" / sid
    namespace = f"file://{project.volume_root}"

    (staged,) = _one_complete(events, "stage")["outputs"]
    assert (staged["namespace"], staged["name"]) == (namespace, f"digits/snapshots/{sid}")
    facet = staged["facets"]["trainyard_snapshot"]
    assert facet["snapshotId"] == sid
    assert (
        facet["manifestHash"]
        == blake3.blake3((snapshot_dir / "manifest.json").read_bytes()).hexdigest()
    )
    assert facet["rows"] == 1797 and facet["shards"] >= 1 and facet["contractVersion"]
    assert staged["outputFacets"]["outputStatistics"]["rowCount"] == 1797
    import yaml

    contract = yaml.safe_load((ROOT / "data_contracts" / "digits.yaml").read_text())
    fields = staged["facets"]["schema"]["fields"]
    assert [(f["name"], f["type"]) for f in fields] == [
        (c["name"], c["type"]) for c in contract["columns"]
    ]
    (source,) = _one_complete(events, "stage")["inputs"]
    assert source["namespace"] == "file" and source["name"].endswith("raw/digits")

    (validated,) = _one_complete(events, "validate")["inputs"]
    assert validated["name"] == f"digits/snapshots/{sid}"
    assert validated["facets"]["schema"] == staged["facets"]["schema"]
    assertions = validated["inputFacets"]["dataQualityAssertions"]["assertions"]
    summary = json.loads((snapshot_dir / "validation" / "summary.json").read_text())
    assert [(a["assertion"], a.get("column"), a["success"]) for a in assertions] == [
        (r["rule"], r["column"], r["success"]) for r in summary["rules"]
    ]
    counted = [a for a in assertions if "element_count" in a.get("params", {})]
    assert counted, assertions
    for a, r in zip(assertions, summary["rules"], strict=True):
        assert a.get("params", {}).get("unexpected_count") == r["unexpected_count"]
        assert a.get("params", {}).get("element_count") == r["element_count"]
        assert a.get("severity") == r["severity"]
    assert any(a.get("column") == "label" for a in assertions)
    (row_count,) = [a for a in assertions if a["assertion"] == "row_count"]
    assert row_count["actual"] == "1797" and "column" not in row_count
    validation = validated["facets"]["trainyard_validation"]
    assert validation["success"] is True and validation["rules"] == len(assertions)


def test_model_and_served_version_facets(run: dict[str, Any]) -> None:
    events, project, last = run["events"], run["project"], run["last"]
    sid = last["stage"]["snapshot_id"]
    version = last["register"]["version"]
    metadata = json.loads(
        (
            project.volume_root / "_models" / "digits" / "versions" / str(version) / "metadata.json"
        ).read_text()
    )

    (model,) = _one_complete(events, "register")["outputs"]
    assert model["name"] == f"_models/digits/versions/{version}"
    facet = model["facets"]["trainyard_model"]
    assert facet["snapshots"] == [sid] and facet["version"] == version
    assert facet["metrics"] == metadata["train_metrics"] and facet["metrics"]
    assert facet["airflowRunId"] == metadata["run_id"]

    (gated,) = _one_complete(events, "evaluate")["outputs"]
    gate = gated["facets"]["trainyard_gate"]
    decision = json.loads(
        (
            project.volume_root / "_models" / "digits" / "versions" / str(version) / "gate.json"
        ).read_text()
    )
    assert gate["verdict"] == "promote" == last["evaluate"]["verdict"]
    assert gate["promote"] is True and gate["reason"] == last["evaluate"]["reason"]
    assert gate["metrics"] == last["evaluate"]["metrics"] and "accuracy" in gate["metrics"]
    assert decision  # the gate report the facet mirrors is next to the version

    (served,) = _one_complete(events, "deploy")["outputs"]
    assert served["namespace"] == f"http://127.0.0.1:{project.port}"
    assert served["name"] == f"v1/models/digits/versions/{version}"
    serving = served["facets"]["trainyard_serving"]
    assert serving["version"] == version and serving["url"] == last["deploy"]["url"]
    assert serving["smokeRows"] == last["deploy"]["smoke_rows"]


def test_lineage_graph_snapshot_to_model_to_served_version(run: dict[str, Any]) -> None:
    """Rebuild the dataset graph from the events alone and walk it."""
    events, last = run["events"], run["last"]
    edges: dict[tuple[str, str], set[tuple[tuple[str, str], str]]] = defaultdict(set)
    for event in events:
        if event.get("eventType") != "COMPLETE":
            continue
        for i in event.get("inputs") or []:
            for o in event.get("outputs") or []:
                src, dst = (i["namespace"], i["name"]), (o["namespace"], o["name"])
                if src != dst:
                    edges[src].add((dst, event["job"]["name"]))

    sid, version = last["stage"]["snapshot_id"], last["register"]["version"]
    snapshot = next(n for n in edges if n[1] == f"digits/snapshots/{sid}")
    # breadth-first from the snapshot: every path to a served version
    paths, queue = [], [(snapshot, [])]
    while queue:
        node, path = queue.pop(0)
        for dst, job in sorted(edges.get(node, ())):
            step = [*path, (job, dst[1])]
            if dst[1].startswith("v1/models/"):
                paths.append(step)
            else:
                queue.append((dst, step))
    assert paths == [
        [
            (f"{DAG_ID}.register", f"_models/digits/versions/{version}"),
            (f"{DAG_ID}.deploy", f"v1/models/digits/versions/{version}"),
        ]
    ]
    # the raw source leads to it too, through stage
    sources = [n for n, out in edges.items() if any(d == snapshot for d, _ in out)]
    assert [n[0] for n in sources] == ["file"]


def _rejected_run(tmp: Path, slow_ports: tuple[int, ...] = ()) -> tuple[Any, list, float]:
    """``dags test`` of digits whose contract rejects the snapshot (a blocking row-count rule):
    its output, its OpenLineage events (file transport) and its wall seconds. ``slow_ports``:
    HTTP lineage endpoints sent each event after the file, each with a 2 s deadline."""
    import shutil
    import time

    import yaml

    contracts = tmp / "contracts"
    shutil.copytree(ROOT / "data_contracts", contracts)
    contract = yaml.safe_load((contracts / "digits.yaml").read_text())
    contract["rules"]["row_count"] = {"min": 100_000}  # the 1,797 digits are too few
    (contracts / "digits.yaml").write_text(yaml.safe_dump(contract, sort_keys=False))
    project, events_file = _lineage_project(tmp, {})
    project.env["TRAINYARD_CONTRACTS_DIR"] = str(contracts)
    if slow_ports:
        to_file = json.loads(project.env["AIRFLOW__OPENLINEAGE__TRANSPORT"])
        slow = [{"type": "http", "url": f"http://127.0.0.1:{p}", "timeout": 2} for p in slow_ports]
        project.env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
            {"type": "composite", "transports": [to_file, *slow]}
        )
    init_airflow(project)
    began = time.monotonic()
    out = project.airflow("dags", "test", DAG_ID)
    elapsed = time.monotonic() - began
    assert out.returncode != 0, "the run should fail at validate"
    text = out.stdout + out.stderr
    assert "ValidationFailed" in text
    assert "row" in text.lower()
    assert not (project.volume_root / "_models" / "digits" / "versions").exists()
    return out, _read_events(events_file), elapsed


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, float]:
    """The rejected run with the file transport alone: its events and wall seconds."""
    _, events, elapsed = _rejected_run(tmp_path_factory.mktemp("lineage-rejected"))
    return events, elapsed


def test_a_rejected_snapshot_fails_with_its_assertions(rejected: tuple[list, float]) -> None:
    """A blocking rule fails validate: the run stops there, naming the rule, and its FAIL
    event still names the snapshot and the rules."""
    events, _ = rejected
    _assert_valid(events)
    (failed,) = [
        e for e in events if e["job"]["name"] == f"{DAG_ID}.validate" and e["eventType"] == "FAIL"
    ]
    (snapshot,) = failed["inputs"]
    sid = snapshot["facets"]["trainyard_snapshot"]["snapshotId"]
    assert snapshot["name"] == f"digits/snapshots/{sid}"
    assert snapshot["facets"]["trainyard_validation"]["success"] is False
    assertions = snapshot["inputFacets"]["dataQualityAssertions"]["assertions"]
    (row_count,) = [a for a in assertions if a["assertion"] == "row_count"]
    assert row_count["success"] is False and row_count["actual"] == "1797"
    assert row_count["severity"] == "error"
    assert all(a["success"] for a in assertions if a["assertion"] != "row_count")
    assert "errorMessage" in failed["run"]["facets"]
    assert not [
        e for e in events if e["job"]["name"] == f"{DAG_ID}.train" and e["eventType"] == "COMPLETE"
    ]


def test_a_dripping_and_a_silent_lineage_endpoint_cost_the_run_seconds(
    rejected: tuple[list, float], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same rejected run, its events also sent to an endpoint that answers a byte every
    0.3 s and to one that never answers: the run ends (it used to never exit), within twice
    its time with the file alone, every event still in the file, the misses as warnings."""
    from tests.support.streams import slow_http_server

    normal_events, normal_s = rejected
    with slow_http_server(drip=True) as dripping, slow_http_server(drip=False) as silent:
        out, events, slow_s = _rejected_run(
            tmp_path_factory.mktemp("lineage-slow"), (dripping, silent)
        )
    assert slow_s <= 2 * normal_s, (slow_s, normal_s)
    kinds = sorted((e["job"]["name"], e["eventType"]) for e in events)
    assert kinds == sorted((e["job"]["name"], e["eventType"]) for e in normal_events)
    text = out.stdout + out.stderr
    assert "did not finish within 2 s" in text or "missed its deadline" in text, text[-3000:]
