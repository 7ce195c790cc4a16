"""OpenLineage datasets and facets of each step, from step results (no Airflow run).

The end-to-end proof is ``tests/e2e/test_lineage.py``; here the names, the facet contents
and their validity against the spec's schemas (``tests/e2e/schemas/openlineage``) are
checked for every step quickly, including a credential in a source URL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openlineage.client.serde import Serde
from referencing import Registry, Resource

from trainyard.config import load_pipeline
from trainyard.orchestration import lineage
from trainyard.settings import get_settings

SPEC = Path(__file__).parents[1] / "e2e" / "schemas" / "openlineage"
SID = "0123456789abcdef"


@pytest.fixture(scope="module")
def registry() -> Registry:
    resources = []
    for path in [SPEC / "OpenLineage.json", *sorted((SPEC / "facets").glob("*.json"))]:
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def _check(registry: Registry, dataset: Any, kind: str) -> dict[str, Any]:
    """Serialise a dataset, validate it and each facet against the spec; return the JSON."""
    data = Serde.to_dict(dataset)
    ref = f"https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/{kind}"
    errors = list(Draft202012Validator({"$ref": ref}, registry=registry).iter_errors(data))
    assert not errors, [e.message for e in errors]
    for group in ("facets", "inputFacets", "outputFacets"):
        for key, facet in (data.get(group) or {}).items():
            v = Draft202012Validator({"$ref": facet["_schemaURL"]}, registry=registry)
            errors = list(v.iter_errors(facet))
            assert not errors, (key, [e.message for e in errors])
    return data


RESULTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "stage": (
        {"interval_start": "2026-11-01T00:00:00+00:00"},
        {
            "snapshot_id": SID,
            "manifest_hash": "ab" * 32,
            "rows": 1797,
            "bytes": 2_000_000,
            "shards": 1,
            "reused": False,
            "given": False,
            "interval_start": "2026-11-01T00:00:00+00:00",
        },
    ),
    "validate": (
        {"snapshot_id": SID},
        {
            "success": True,
            "snapshot_id": SID,
            "rows": 1797,
            "warnings": 1,
            "report_dir": "/v/digits/snapshots/x/validation",
            "rules": [
                {
                    "rule": "row_count",
                    "column": None,
                    "severity": "error",
                    "success": True,
                    "unexpected_count": None,
                    "element_count": None,
                    "reason": "",
                    "observed": 1797,
                },
                {
                    "rule": "regex",
                    "column": "key",
                    "severity": "warn",
                    "success": False,
                    "unexpected_count": 3,
                    "element_count": 1797,
                    "reason": "3 keys",
                },
            ],
        },
    ),
    "register": (
        {"snapshot_id": SID, "run_id": "manual__1"},
        {
            "version": 4,
            "metrics": {"accuracy": 0.9},
            "attempts": 1,
            "seconds": 3.5,
            "snapshots": ["aaaaaaaaaaaaaaaa", SID],
        },
    ),
    "evaluate": (
        {"version": 4},
        {
            "promote": False,
            "verdict": "reject",
            "reason": "accuracy 0.9 < 0.95",
            "version": 4,
            "champion": 3,
            "metrics": {"accuracy": 0.9},
            "champion_metrics": {"accuracy": 0.95},
        },
    ),
    "deploy": (
        {"version": 4},
        {
            "version": 4,
            "previous": 3,
            "smoke_rows": 8,
            "url": "http://127.0.0.1:8501/v1/models/digits/versions/4:predict",
        },
    ),
}


def _lineage(step: str) -> Any:
    values, result = RESULTS[step]
    return lineage.step_lineage(step, load_pipeline("digits"), values, result, "manual__1")


def test_stage_names_the_source_and_the_snapshot_with_schema_and_hash(registry: Registry) -> None:
    ol = _lineage("stage")
    (source,) = [_check(registry, d, "InputDataset") for d in ol.inputs]
    (snapshot,) = [_check(registry, d, "OutputDataset") for d in ol.outputs]
    assert source["namespace"] == "file" and source["name"].endswith("/raw/digits")
    assert snapshot["namespace"] == f"file://{get_settings().volume_root}"
    assert snapshot["name"] == f"digits/snapshots/{SID}"
    facet = snapshot["facets"]["trainyard_snapshot"]
    assert (facet["snapshotId"], facet["manifestHash"], facet["rows"]) == (SID, "ab" * 32, 1797)
    assert [f["name"] for f in snapshot["facets"]["schema"]["fields"]][:2] == ["key", "label"]
    assert snapshot["outputFacets"]["outputStatistics"]["rowCount"] == 1797


def test_validate_turns_every_rule_into_an_assertion_with_counts(registry: Registry) -> None:
    (snapshot,) = [_check(registry, d, "InputDataset") for d in _lineage("validate").inputs]
    rows, regex = snapshot["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert rows == {
        "assertion": "row_count",
        "success": True,
        "severity": "error",
        "actual": "1797",
        "params": {"observed": 1797},
    }
    assert (regex["column"], regex["success"], regex["severity"]) == ("key", False, "warn")
    assert (regex["actual"], regex["expected"]) == ("3", "0")
    assert regex["params"] == {"unexpected_count": 3, "element_count": 1797}
    facet = snapshot["facets"]["trainyard_validation"]
    assert (facet["success"], facet["rules"], facet["failed"]) == (True, 2, 1)


def test_register_evaluate_deploy_chain_the_model_version(registry: Registry) -> None:
    reg, ev, dep = _lineage("register"), _lineage("evaluate"), _lineage("deploy")
    inputs = [_check(registry, d, "InputDataset")["name"] for d in reg.inputs]
    assert inputs == ["digits/snapshots/aaaaaaaaaaaaaaaa", f"digits/snapshots/{SID}"]
    (model,) = [_check(registry, d, "OutputDataset") for d in reg.outputs]
    assert model["name"] == "_models/digits/versions/4"
    assert model["facets"]["trainyard_model"]["airflowRunId"] == "manual__1"
    assert [_check(registry, d, "InputDataset")["name"] for d in ev.inputs] == [
        "_models/digits/versions/4",
        "_models/digits/versions/3",
    ]
    (gated,) = [_check(registry, d, "OutputDataset") for d in ev.outputs]
    gate = gated["facets"]["trainyard_gate"]
    assert (gate["verdict"], gate["promote"], gate["champion"]) == ("reject", False, 3)
    assert gate["championMetrics"] == {"accuracy": 0.95}
    (served,) = [_check(registry, d, "OutputDataset") for d in dep.outputs]
    assert (served["namespace"], served["name"]) == (
        "http://127.0.0.1:8501",
        "v1/models/digits/versions/4",
    )
    assert served["facets"]["trainyard_serving"]["previous"] == 3


def test_steps_without_datasets_and_missing_results_give_empty_lineage() -> None:
    cfg = load_pipeline("digits")
    assert lineage.step_lineage("summary", cfg, {}, {"pipeline": "digits"}).inputs == []
    assert lineage.step_lineage("deploy", cfg, {"version": 1}, None).outputs == []
    assert lineage.failed_step_lineage("deploy", cfg, {"version": 1}).inputs == []


def test_source_credentials_never_reach_a_dataset_name() -> None:
    namespace, name = lineage.source_dataset("https://user:SECRET@host.example/x/{ds}.csv?sig=abc")
    assert "SECRET" not in namespace + name and "abc" not in namespace + name
    assert lineage.source_dataset("s3://bucket/raw/t.csv") == ("s3://bucket", "raw/t.csv")
    assert lineage.source_dataset("/data/raw") == ("file", "/data/raw")


def test_a_failed_validate_reads_the_rejected_snapshots_report(
    registry: Registry, tmp_path: Path
) -> None:
    import dataclasses

    settings = dataclasses.replace(get_settings(), volume_root=tmp_path)
    cfg = load_pipeline("digits")
    report = tmp_path / "digits" / "snapshots" / SID / "validation"
    report.mkdir(parents=True)
    rule = {
        "rule": "row_count",
        "column": None,
        "severity": "error",
        "success": False,
        "unexpected_count": None,
        "element_count": None,
        "reason": "too few",
        "observed": 12,
        "samples": [],
        "rows": [1, 2],
    }
    summary = {"snapshot_id": SID, "success": False, "rows": 12, "warnings": [], "rules": [rule]}
    (report / "rejected.json").write_text(json.dumps(summary))
    (report / "summary.json").write_text(json.dumps(summary))
    ol = lineage.failed_step_lineage("validate", cfg, {"snapshot_id": SID}, settings)
    (snapshot,) = [_check(registry, d, "InputDataset") for d in ol.inputs]
    (assertion,) = snapshot["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert (assertion["assertion"], assertion["success"], assertion["actual"]) == (
        "row_count",
        False,
        "12",
    )
    assert snapshot["facets"]["trainyard_validation"]["report"] == str(report)
    # no report (a cluster's volume is not mounted here): the snapshot, without assertions
    other = lineage.failed_step_lineage("validate", cfg, {"snapshot_id": "f" * 16}, settings)
    (bare,) = [_check(registry, d, "InputDataset") for d in other.inputs]
    assert bare["inputFacets"] == {} and bare["name"] == f"digits/snapshots/{'f' * 16}"
    # a report without a rejection (an earlier pass; the validator crashed this time)
    passed = tmp_path / "digits" / "snapshots" / ("e" * 16) / "validation"
    passed.mkdir(parents=True)
    (passed / "summary.json").write_text(json.dumps({**summary, "snapshot_id": "e" * 16}))
    crashed = lineage.failed_step_lineage("validate", cfg, {"snapshot_id": "e" * 16}, settings)
    assert Serde.to_dict(crashed.inputs[0])["inputFacets"] == {}


@pytest.mark.parametrize("timeout", ["abc", None, -1, 0, float("nan"), True, "inf"])
def test_an_http_transport_timeout_that_is_no_duration_is_refused_naming_it(timeout) -> None:
    """Found by a new user: each of these failed every event with a library's message
    (``could not convert string to float``, ``must be an int, float or None``), and 0
    marked the endpoint down without sending anything."""
    from openlineage.client import OpenLineageClient

    from trainyard.orchestration import lineage_transport

    lineage_transport.install()
    url = "http://user:secret@127.0.0.1:9/lineage"
    with pytest.raises(ValueError, match="timeout must be a number of seconds above 0") as e:
        OpenLineageClient(config={"transport": {"type": "http", "url": url, "timeout": timeout}})
    assert repr(timeout) in str(e.value) and "secret" not in str(e.value)


def test_an_http_transport_timeout_given_as_text_is_its_seconds() -> None:
    from openlineage.client import OpenLineageClient

    from trainyard.orchestration import lineage_transport

    lineage_transport.install()
    config = {"type": "http", "url": "http://127.0.0.1:9", "timeout": "1.5"}
    assert OpenLineageClient(config={"transport": config}).transport.timeout == 1.5
