"""A task's parse builds its own DAG alone; the dag-processor's builds every pipeline's.

Airflow's own ``BundleDagBag`` parses the real DAG file over 200 generated pipelines
(copies of the shipped two under other names), with and without the parsing context
Airflow sets when a worker starts a task (``task_runner.parse``) or ``airflow tasks test``
/ ``dags test`` load a DAG (``airflow.utils.cli.get_bagged_dag``: a DAG id, no task).
How long each takes is measured in benchmarks/dag_parse.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "dags" / "trainyard_pipelines.py"
SHIPPED = sorted((ROOT / "dags" / "pipelines").glob("*.yaml"))
N = 200


def _generate(folder: Path, n: int) -> list[str]:
    """Copies of the shipped pipelines under other names, each serving its own model."""
    folder.mkdir()
    texts = [(p.stem, p.read_text()) for p in SHIPPED]
    names = []
    for i in range(n):
        stem, text = texts[i % len(texts)]
        name = f"{stem}_{i:03d}"
        text = text.replace(f"name: {stem}\n", f"name: {name}\n", 1)
        text = text.replace(f"model_name: {stem}\n", f"model_name: {name}\n", 1)
        (folder / f"{name}.yaml").write_text(text)
        names.append(name)
    return names


def _bag(dag_id: str | None = None, task_id: str | None = None) -> dict:
    """The DAGs Airflow's BundleDagBag finds in the DAG file, in a parsing context if given.

    The context is what ``get_parsing_context()`` reads: two environment variables
    (Airflow's own context manager sets them and leaves them set, so they are set here
    and removed after).
    """
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.sdk.definitions.context import (
        _AIRFLOW_PARSING_CONTEXT_DAG_ID,
        _AIRFLOW_PARSING_CONTEXT_TASK_ID,
    )

    with pytest.MonkeyPatch.context() as mp:
        for name, value in (
            (_AIRFLOW_PARSING_CONTEXT_DAG_ID, dag_id),
            (_AIRFLOW_PARSING_CONTEXT_TASK_ID, task_id),
        ):
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, value)
        bag = BundleDagBag(
            dag_folder=str(DAG_FILE),
            bundle_path=DAG_FILE.parent,
            bundle_name="dags-folder",
            load_op_links=False,
        )
    assert bag.import_errors == {}
    return bag.dags


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    folder = tmp_path_factory.mktemp("scale") / "pipelines"
    names = _generate(folder, N)
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    mp.setenv("TRAINYARD_VOLUME_ROOT", str(folder.parent / "volumes"))
    mp.setenv("TRAINYARD_RUNNER", "local")
    yield folder, names
    mp.undo()


@pytest.fixture(scope="module")
def whole(pipelines: tuple[Path, list[str]]) -> dict:
    return _bag()


def test_the_dag_processor_builds_every_pipeline(
    pipelines: tuple[Path, list[str]], whole: dict
) -> None:
    _, names = pipelines
    assert sorted(whole) == sorted(f"trainyard_{n}" for n in names)
    assert all("invalid-config" not in d.tags for d in whole.values())


@pytest.mark.parametrize("task_id", ["validate", None], ids=["worker", "dags-test"])
def test_a_task_parse_builds_its_dag_alone(
    pipelines: tuple[Path, list[str]], whole: dict, task_id: str | None
) -> None:
    _, names = pipelines
    dag_id = f"trainyard_{names[N // 2]}"
    dags = _bag(dag_id, task_id)
    assert list(dags) == [dag_id]
    assert dags[dag_id].task_ids == whole[dag_id].task_ids
    assert dict(dags[dag_id].params) == dict(whole[dag_id].params)


def test_a_task_parse_of_an_unknown_dag_builds_none(pipelines: tuple[Path, list[str]]) -> None:
    assert _bag("trainyard_nobody", "stage") == {}


def test_a_task_parse_keeps_what_the_whole_folder_decides(tmp_path: Path, monkeypatch) -> None:
    """A stand-in's task gets the stand-in: broken file, name clash, DAG id owned by another."""
    folder = tmp_path / "pipelines"
    names = _generate(folder, 4)
    (folder / "zz_broken.yaml").write_text("name: zz_broken\ndataset: [\n")
    # a copy that keeps another pipeline's served model name: refused by the full build
    raw = yaml.safe_load((folder / f"{names[0]}.yaml").read_text())
    raw["name"] = "zz_clash"
    (folder / "zz_clash.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    # 'zz-owned.yaml' would have the DAG id of the valid 'zz_owned.yaml': it gets a suffix
    raw = {**raw, "name": "zz_owned", "serving": {**raw["serving"], "model_name": "zz_o"}}
    (folder / "zz_owned.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (folder / "zz-owned.yaml").write_text("name: zz-owned\n")
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))

    whole = _bag()
    (stand_in,) = [i for i in whole if i.startswith("trainyard_zz_owned_")]
    assert "serving.model_name of pipeline" in whole["trainyard_zz_clash"].doc_md
    for dag_id, task_id in (
        ("trainyard_zz_broken", "invalid_config"),
        ("trainyard_zz_clash", "invalid_config"),
        (stand_in, "invalid_config"),
        ("trainyard_zz_owned", "stage"),
    ):
        dags = _bag(dag_id, task_id)
        assert list(dags) == [dag_id]
        assert dags[dag_id].task_ids == whole[dag_id].task_ids
        assert dags[dag_id].doc_md == whole[dag_id].doc_md


def test_one_pipeline_that_fails_to_build_leaves_the_others(tmp_path: Path, monkeypatch) -> None:
    # found here: a pipeline with more workers than this machine's trigger-form cap made
    # Airflow's DAG refuse its form (a ValueError), and every trainyard DAG disappeared
    from trainyard.orchestration.graph import build_dags, max_workers

    folder = tmp_path / "pipelines"
    names = _generate(folder, 4)
    raw = yaml.safe_load((folder / f"{names[0]}.yaml").read_text())
    raw["training"]["workers"] = max_workers() + 1
    (folder / f"{names[0]}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    dags = build_dags(folder)
    assert sorted(dags) == sorted(f"trainyard_{n}" for n in names)
    bad = dags[f"trainyard_{names[0]}"]
    assert bad.task_ids == ["invalid_config"]
    assert f"'workers' defaults to {max_workers() + 1}" in bad.doc_md
    assert all(dags[f"trainyard_{n}"].task_ids != ["invalid_config"] for n in names[1:])


def test_the_workers_cap_follows_the_runner_of_each_parse(monkeypatch) -> None:
    # found by xdist's order: the cap was cached from the first parse of the process, so a
    # local parse after a kubernetes one offered 64 workers (and the other way round, 4)
    from trainyard.orchestration.graph import max_workers

    monkeypatch.setenv("TRAINYARD_RUNNER", "kubernetes")
    assert max_workers() == 64
    monkeypatch.setenv("TRAINYARD_RUNNER", "local")
    assert max_workers() <= 2 * (os.cpu_count() or 1)
