"""Pipeline configs are a documented, checked format: schema, descriptions, check command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from trainyard.config import parse_pipeline, pipeline_json_schema
from trainyard.errors import ConfigError
from trainyard.pipelines import check_pipeline

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "dags" / "pipelines"
NEGATIVE = sorted((ROOT / "tests" / "fixtures" / "pipelines" / "negative").glob("*.yaml"))
SHIPPED = sorted(PIPELINES.glob("*.yaml"))


def _expect(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", NEGATIVE, ids=[p.stem for p in NEGATIVE])
def test_negative_fixture_fails_with_file_line_and_field(path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        check_pipeline(path)
    text = str(exc.value)
    assert _expect(path) in text, text
    assert str(path) in text
    if path.stem not in ("not_a_mapping",):
        assert re.search(rf"{re.escape(str(path))}:\d+", text), text  # a line number


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_pipelines_pass_the_check_and_the_json_schema(path: Path) -> None:
    check_pipeline(path)
    schema = json.loads((PIPELINES / "pipeline.schema.json").read_text())
    jsonschema.validate(
        json.loads(json.dumps(yaml.safe_load(path.read_text()), default=str)), schema
    )


def test_json_schema_file_is_the_config_models_schema() -> None:
    shipped = (PIPELINES / "pipeline.schema.json").read_text().strip()
    assert shipped == pipeline_json_schema(), (
        "dags/pipelines/pipeline.schema.json is stale: "
        "python -m trainyard pipelines schema > dags/pipelines/pipeline.schema.json"
    )
    jsonschema.validators.validator_for(json.loads(shipped)).check_schema(json.loads(shipped))


def _fields(schema: dict, defs: dict, prefix: str = "") -> set[str]:
    if "$ref" in schema:
        schema = defs[schema["$ref"].split("/")[-1]]
    found: set[str] = set()
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            found |= _fields(sub, defs, prefix)
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        found |= {path} | _fields(sub, defs, path)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        found |= _fields(extra, defs, f"{prefix}.<name>")
    return found


def test_schema_describes_every_field() -> None:
    # docs/reference/pipeline-yaml.md is generated from the descriptions (make docs)
    schema = json.loads(pipeline_json_schema())
    defs = schema.get("$defs", {})
    fields = _fields(schema, defs)
    assert fields, "no fields found"

    def described(path: str) -> bool:
        node: dict = schema
        for key in path.split("."):
            node = _step(node, defs, key)
        return bool(node.get("description") or _deref(node, defs).get("description"))

    missing = sorted(f for f in fields if not described(f))
    assert missing == [], f"fields without a description in trainyard/config.py: {missing}"


def _deref(schema: dict, defs: dict) -> dict:
    if "$ref" in schema:
        return defs[schema["$ref"].split("/")[-1]]
    return schema


def _step(schema: dict, defs: dict, key: str) -> dict:
    """The schema of ``key`` under ``schema`` (through $ref, anyOf and maps)."""
    schema = _deref(schema, defs)
    for sub in [schema, *(_deref(s, defs) for s in schema.get("anyOf", []))]:
        if key == "<name>" and isinstance(sub.get("additionalProperties"), dict):
            return sub["additionalProperties"]
        if key in sub.get("properties", {}):
            return sub["properties"][key]
    raise KeyError(key)


def test_check_command_names_every_problem_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (ROOT / "tests/fixtures/pipelines/negative/unknown_model.yaml")
        .read_text()
        .replace("unknown_model", "bad")
        .replace("format: image_folder", "format: csv")
    )
    env = {"PYTHONPATH": str(ROOT / "plugins"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "trainyard", "pipelines", "check", str(bad), *map(str, SHIPPED)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 1, out
    assert f"{bad}:9: training.model: unknown model 'resnet'" in out.stderr
    assert f"{bad}:7: source.format: 'csv'" in out.stderr
    assert "1 of 4 pipeline(s) invalid" in out.stderr
    assert all(f"ok   {p}" in out.stdout for p in SHIPPED)


def test_parse_alone_stays_cheap_and_does_not_read_contracts(tmp_path: Path) -> None:
    # DAG parsing uses parse_pipeline only: an unknown model is the check's business
    path = tmp_path / "unknown_model.yaml"
    path.write_text((NEGATIVE[0].parent / "unknown_model.yaml").read_text())
    assert parse_pipeline(path).training.model == "resnet"


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    # a new user met them in three rounds (keys given twice, then the schema, then names)
    path = ROOT / "tests" / "fixtures" / "pipelines" / "every_problem_at_once.yaml"
    with pytest.raises(ConfigError) as exc:
        check_pipeline(path)
    text = str(exc.value)
    for needle in (
        ":11: training.workers: key given twice",
        ":7: source.colour: unknown field",
        ":12: training.epochs: Input should be greater than or equal to 0",
        ":9: training.model: unknown model 'resnet'",
        ":6: source.format: 'csv', but the contract of 'digits' says 'image_folder'",
        ":14: gate.metrics[1]: unknown metric 'f1'",
    ):
        assert needle in text, text


def test_two_pipelines_may_not_serve_under_one_model_name(tmp_path: Path, monkeypatch) -> None:
    # A user copied digits.yaml for a variant and kept serving.model_name: both pipelines
    # would publish their version 1, 2, ... into one served model, each over the other's.
    from trainyard.orchestration.graph import build_dags
    from trainyard.pipelines import ensure_own_names

    folder = tmp_path / "pipelines"
    folder.mkdir()
    text = (ROOT / "dags" / "pipelines" / "digits.yaml").read_text()
    (folder / "digits.yaml").write_text(text)
    variant = text.replace("name: digits\n", "name: digits_wide\n", 1)
    variant = variant.replace("model_name: digits", "model_name: Digits")  # case-blind
    (folder / "digits_wide.yaml").write_text(variant)
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "v"))
    line = variant.splitlines().index("  model_name: Digits") + 1

    with pytest.raises(ConfigError) as exc:
        check_pipeline(folder / "digits_wide.yaml")
    assert (
        f"digits_wide.yaml:{line}: serving.model_name: 'Digits' is also (as 'digits') the "
        "serving.model_name of pipeline 'digits', which keeps it"
    ) in str(exc.value)
    with pytest.raises(ConfigError, match=r"pipeline 'digits_wide': serving\.model_name"):
        ensure_own_names(parse_pipeline(folder / "digits_wide.yaml"))

    dags = build_dags(folder)  # the first (sorted) keeps its DAG; the second is broken
    assert dags["trainyard_digits"].task_ids != ["invalid_config"]
    assert dags["trainyard_digits_wide"].task_ids == ["invalid_config"]
    assert "serving.model_name of pipeline 'digits', which keeps it" in (
        dags["trainyard_digits_wide"].doc_md
    )
    # a pipeline that has registered models keeps its names over one that has none:
    # a new file sorting first never takes them from the pipeline that ran
    (tmp_path / "v" / "_models" / "digits_wide" / "versions" / "1").mkdir(parents=True)
    assert check_pipeline(folder / "digits_wide.yaml").name == "digits_wide"
    with pytest.raises(ConfigError, match="pipeline 'digits_wide', which keeps it"):
        check_pipeline(folder / "digits.yaml")
    dags = build_dags(folder)
    assert dags["trainyard_digits"].task_ids == ["invalid_config"]
    assert dags["trainyard_digits_wide"].task_ids != ["invalid_config"]
    import shutil

    shutil.rmtree(tmp_path / "v" / "_models")

    # the pipeline that had the name keeps it: only the copy added later is refused
    assert check_pipeline(folder / "digits.yaml").serving.model_name == "digits"
    ensure_own_names(parse_pipeline(folder / "digits.yaml"))

    (folder / "digits_wide.yaml").write_text(variant.replace("Digits", "digits_wide"))
    assert check_pipeline(folder / "digits_wide.yaml").serving.model_name == "digits_wide"
    ensure_own_names(parse_pipeline(folder / "digits_wide.yaml"))


def test_two_pipelines_may_not_render_one_kubernetes_object(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # Distinct model names can still render one Deployment: 'fraud.model' is cut and
    # hashed into serving-fraud-model-80a7545c, the very name of model 'fraud-model-80a7545c'
    from trainyard import k8s
    from trainyard.pods import pipelines_main as cli_main

    folder = tmp_path / "pipelines"
    folder.mkdir()
    raw = yaml.safe_load((PIPELINES / "transactions.yaml").read_text())
    hashed = k8s.serving_name("fraud.model")
    assert hashed == "serving-fraud-model-80a7545c"
    for name, model in (("fraud_eu", "fraud.model"), ("fraud_us", "fraud-model-80a7545c")):
        pipeline = {**raw, "name": name, "serving": {**raw["serving"], "model_name": model}}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "v"))

    assert check_pipeline(folder / "fraud_eu.yaml").name == "fraud_eu"  # sorts first: keeps it
    with pytest.raises(ConfigError) as exc:
        check_pipeline(folder / "fraud_us.yaml")
    text = str(exc.value)
    assert (
        "serving.model_name: pipelines 'fraud_eu' (serving.model_name) and 'fraud_us' would "
        f"both render the Kubernetes serving Deployment and Service {hashed!r}, which "
        "'fraud_eu' keeps"
    ) in text, text
    assert "serving selector trainyard.io/model 'fraud-model-80a7545c'" in text
    assert cli_main(["check"]) == 1
    out = capsys.readouterr()
    assert "fraud_us.yaml" in out.out + out.err and hashed in out.out + out.err

    # another model name: nothing rendered is shared (the training prefixes differ too)
    us = yaml.safe_load((folder / "fraud_us.yaml").read_text())
    us["serving"]["model_name"] = "fraud_us"
    (folder / "fraud_us.yaml").write_text(yaml.safe_dump(us, sort_keys=False))
    assert cli_main(["check"]) == 0


def test_two_datasets_may_not_render_one_volume(tmp_path: Path, monkeypatch) -> None:
    # 'tx__eu' and 'tx_eu' both became PVC trainyard-data-tx-eu: on a cluster the second
    # dataset's staging and retention would have acted on the first's snapshots
    from trainyard import k8s

    assert k8s.dataset_pvc_name("tx__eu") == k8s.dataset_pvc_name("tx_eu") == "trainyard-data-tx-eu"
    folder, contracts = tmp_path / "pipelines", tmp_path / "contracts"
    folder.mkdir()
    contracts.mkdir()
    raw = yaml.safe_load((PIPELINES / "transactions.yaml").read_text())
    contract = yaml.safe_load((ROOT / "data_contracts" / "transactions.yaml").read_text())
    for name, dataset in (("eu", "tx__eu"), ("eu_copy", "tx__eu"), ("eu2", "tx_eu")):
        (contracts / f"{dataset}.yaml").write_text(
            yaml.safe_dump({**contract, "dataset": dataset}, sort_keys=False)
        )
        pipeline = {
            **raw,
            "name": name,
            "dataset": dataset,
            "serving": {**raw["serving"], "model_name": name},
        }
        pipeline.pop("scoring", None)
        pipeline.pop("trigger", None)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    volumes = tmp_path / "v"
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(contracts))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(volumes))

    # between unstaged datasets the name that sorts first keeps it ('tx__eu' < 'tx_eu');
    # two pipelines of one dataset share its volume
    assert check_pipeline(folder / "eu.yaml").dataset == "tx__eu"
    assert check_pipeline(folder / "eu_copy.yaml").dataset == "tx__eu"
    with pytest.raises(ConfigError) as exc:
        check_pipeline(folder / "eu2.yaml")
    text = str(exc.value)
    assert (
        "dataset: datasets 'tx__eu' (pipeline 'eu') and 'tx_eu' would both use the "
        "Kubernetes PersistentVolumeClaim 'trainyard-data-tx-eu', which 'tx__eu' keeps"
    ) in text, text

    # a dataset already staged keeps its volume's name over one that sorts first
    (volumes / "tx_eu" / "snapshots" / "0123456789abcdef").mkdir(parents=True)
    assert check_pipeline(folder / "eu2.yaml").dataset == "tx_eu"
    with pytest.raises(ConfigError, match="which 'tx_eu' keeps"):
        check_pipeline(folder / "eu.yaml")


@pytest.mark.parametrize("name", ["../evil", "a/b", "has space", "trânsactions", ".", "x" * 64])
def test_a_model_name_is_one_safe_folder_and_path_name(tmp_path: Path, name: str) -> None:
    # it names a folder of the serving root and a path of the serving API: "../evil"
    # wrote a model config outside the serving root
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    raw["serving"]["model_name"] = name
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"serving\.model_name: .*use 1 to 63 of A-Z"):
        parse_pipeline(path)


def test_two_pipelines_may_not_write_scores_to_one_stream(tmp_path: Path, monkeypatch) -> None:
    # A cold user's copy with the same scoring.stream doubled every score in the output,
    # with nothing in an entry to tell the two pipelines' scores apart.
    from trainyard.pipelines import ensure_own_names

    folder = tmp_path / "pipelines"
    folder.mkdir()
    base = yaml.safe_load((ROOT / "dags" / "pipelines" / "transactions.yaml").read_text())
    same = {"input": "tx.in", "output": "tx.scores", "dead_letter": "tx.dead"}
    base["scoring"] = {"stream": same}
    (folder / "transactions.yaml").write_text(yaml.safe_dump(base))
    copy = {**base, "name": "tx_copy", "serving": {**base["serving"], "model_name": "tx_copy"}}
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))

    def check(stream: dict) -> str:
        copy["scoring"] = {"stream": stream}
        (folder / "tx_copy.yaml").write_text(yaml.safe_dump(copy))
        try:
            ensure_own_names(parse_pipeline(folder / "tx_copy.yaml"))
            check_pipeline(folder / "tx_copy.yaml")
        except ConfigError as e:
            return str(e)
        return "ok"

    assert "scoring.stream.output: 'tx.scores' is also the scoring.stream.output of " in (
        check(same)
    )
    # its dead letters into the other's scores
    crossed = {"input": "tx.in", "output": "copy.scores", "dead_letter": "tx.scores"}
    assert "scoring.stream.dead_letter: 'tx.scores' is also the scoring.stream.output of" in (
        check(crossed)
    )
    # reading the same input is a second consumer group: allowed, as are other servers
    assert check({"input": "tx.in", "output": "copy.scores", "dead_letter": "copy.dead"}) == "ok"
    assert check({**same, "url": "redis://other:6379/0"}) == "ok"
    assert check_pipeline(folder / "transactions.yaml").name == "transactions"
    # a cold user's two pipelines sent each other's dead letters back and forth: Redis
    # grew to 713 MB in 10 s. A stream a scorer writes is never one a pipeline reads.
    loop = {"input": "copy.in", "output": "copy.scores", "dead_letter": "tx.in"}
    why = check(loop)
    assert "scoring.stream.dead_letter: 'tx.in' is the scoring.stream.input of pipeline " in why
    assert "'transactions': a stream a scorer writes must not be one a pipeline reads" in why
    assert "scoring.stream.output: 'tx.in'" in check(
        {**loop, "output": "tx.in", "dead_letter": "d"}
    )
    # ... the other way round the first pipeline is refused too
    copy["scoring"] = {"stream": {"input": "copy.in", "output": "c.out", "dead_letter": "c.dead"}}
    (folder / "tx_copy.yaml").write_text(yaml.safe_dump(copy))
    base["scoring"] = {"stream": {**same, "dead_letter": "copy.in"}}
    (folder / "transactions.yaml").write_text(yaml.safe_dump(base))
    with pytest.raises(
        ConfigError, match=re.escape("'copy.in' is the scoring.stream.input of pipeline 'tx_")
    ):
        check_pipeline(folder / "transactions.yaml")
    # scores into a pipeline's trigger stream (its own too) would start runs
    base["scoring"] = {"stream": same}
    (folder / "transactions.yaml").write_text(yaml.safe_dump(base))
    copy["trigger"] = {"stream": {"name": "c.out"}}
    (folder / "tx_copy.yaml").write_text(yaml.safe_dump(copy))
    with pytest.raises(
        ConfigError, match=re.escape("'c.out' is the trigger.stream.name of pipeline 'tx_")
    ):
        check_pipeline(folder / "tx_copy.yaml")
    copy["trigger"] = {"stream": {"name": "tx.scores"}}
    (folder / "tx_copy.yaml").write_text(yaml.safe_dump(copy))
    with pytest.raises(
        ConfigError, match=re.escape("'tx.scores' is the trigger.stream.name of pipeline 'tx_")
    ):
        check_pipeline(folder / "transactions.yaml")
    del copy["trigger"]
    # Found by a cold user: a copy in the first one's consumer group on its input took a
    # share of its records (scored by the copy's model, into the copy's output)
    group = {"input": "tx.in", "output": "c.out", "dead_letter": "c.dead"}
    why = check({**group, "group": "trainyard-transactions"})
    assert "scoring.stream.group: 'trainyard-transactions' is also the scoring.stream.group " in why
    assert "one consumer group on one stream splits its entries" in why
    assert check({**group, "group": "trainyard-transactions", "input": "c.in"}) == "ok"
    # ... and a trigger stream that is a stream of records to score (its own too)
    copy["trigger"] = {"stream": {"name": "tx.in"}}
    why = check({**group, "input": "c.in"})
    assert (
        "trigger.stream.name: 'tx.in' is the scoring.stream.input of pipeline 'transactions'" in why
    )
    copy["trigger"] = {"stream": {"name": "c.in"}}
    why = check({**group, "input": "c.in"})  # its own
    assert "'c.in' is the trigger.stream.name of pipeline 'tx_copy'" in why, why
    assert "records to score and messages that data arrived need streams of their own" in why
    del copy["trigger"]


def test_check_says_a_yml_file_is_ignored(tmp_path: Path, monkeypatch, capsys) -> None:
    from trainyard.pods import pipelines_main as cli_main

    (tmp_path / "digits.yaml").write_text((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    (tmp_path / "tx.yml").write_text("name: tx\n")  # a user's copy: no DAG, said nowhere
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(tmp_path))
    assert cli_main(["check"]) == 0
    assert f"{tmp_path / 'tx.yml'}: ignored: pipeline files end in .yaml" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override",
    [{"epochs": True}, {"learning_rate": False}, {"workers": True}, {"epochs": "2"}],
    ids=str,
)
def test_a_boolean_or_text_is_not_a_number_in_a_training_override(override: dict) -> None:
    """Found by cold users: ``{"epochs": true}`` trained one epoch (pydantic read it as
    1), and ``{"epochs": "2"}`` two."""
    from trainyard.config import load_pipeline
    from trainyard.steps import training_params

    with pytest.raises(ConfigError, match=r"invalid training override: \w+: expected a number"):
        training_params(load_pipeline("digits"), override)
    assert training_params(load_pipeline("digits"), {"epochs": 3}).epochs == 3


def test_an_unknown_priority_override_is_refused_before_anything_runs() -> None:
    """Found by a cold user: ``--overrides '{"priority": "ultra"}'`` was refused only by
    the train step, after staging and validation had run."""
    from trainyard.config import load_pipeline
    from trainyard.steps import training_params

    with pytest.raises(ConfigError, match=r"priority: unknown priority tier 'ultra' \(known: "):
        training_params(load_pipeline("digits"), {"priority": "ultra"})
    assert training_params(load_pipeline("digits"), {"priority": "low"}).priority == "low"


def test_checked_for_a_cluster_a_pipeline_passes_only_what_renders(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # A cold user's Redis stream without a url passed `pipelines check --profile ...` and
    # under TRAINYARD_RUNNER=kubernetes, then `render --step all` refused the pipeline
    from trainyard.pods import pipelines_main as cli_main
    from trainyard.pods import render_problems

    folder = tmp_path / "pipelines"
    folder.mkdir()
    raw = yaml.safe_load((PIPELINES / "transactions.yaml").read_text())
    stream = {"input": "tx.in", "output": "tx.scores", "dead_letter": "tx.dead"}
    raw["scoring"] = {"stream": stream}
    path = folder / "transactions.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    monkeypatch.delenv("TRAINYARD_RUNNER", raising=False)
    profile = str(ROOT / "deploy" / "cluster_profile.yaml")

    # on this machine the project's own Redis serves it: valid, and the ok line says so
    assert cli_main(["check"]) == 0
    out = capsys.readouterr().out
    assert "ok   " in out and "not for a cluster: scoring.stream: engine redis without url" in out
    # for a cluster: refused with the file's line, both ways of asking
    assert cli_main(["check", "--profile", profile]) == 1
    err = capsys.readouterr().err
    assert re.search(r"transactions\.yaml:\d+: scoring\.stream: engine redis without url", err)
    monkeypatch.setenv("TRAINYARD_RUNNER", "kubernetes")
    assert cli_main(["check"]) == 1
    capsys.readouterr()

    # with a url it renders: the check passes what render prints
    raw["scoring"]["stream"]["url"] = "redis://scores.example:6379/0"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert cli_main(["check"]) == 0
    assert "not for a cluster" not in capsys.readouterr().out
    from trainyard.k8s.profile import load_cluster_profile

    assert render_problems(load_cluster_profile(Path(profile)), parse_pipeline(path)) == []


@pytest.mark.parametrize(
    ("url", "window", "expected"),
    [
        (".trainyard/raw/tx/{ds}.csv", None, {"intervals": 30}),
        (".trainyard/raw/tx/{ds}.csv", "newest", "newest"),
        (".trainyard/raw/tx/{ds}.csv", {"since": "2026-11-01"}, {"since": "2026-11-01"}),
        (".trainyard/raw/tx/all.csv", None, "newest"),
    ],
)
def test_a_partitioned_source_trains_on_its_last_intervals_unless_told(
    tmp_path: Path, url: str, window: object, expected: object
) -> None:
    """Found by a new user (issue 38): a backfilled new dataset trained on its newest day
    only (95 of its 569 rows), silently: a source partitioned by ``{ds}`` brings each
    interval's rows apart, so its default window is its last 30 validated intervals."""
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "transactions.yaml").read_text())
    raw["source"]["url"] = url
    raw["training"].pop("window")
    if window is not None:
        raw["training"]["window"] = window
    (tmp_path / "transactions.yaml").write_text(yaml.safe_dump(raw))
    cfg = parse_pipeline(tmp_path / "transactions.yaml")
    assert cfg.training.model_dump(mode="json")["window"] == expected
