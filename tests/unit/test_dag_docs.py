"""The DAG docs never show credentials written into a pipeline's source URL."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("secret", ["TOKEN", "wJa/TOKEN+K", "se#TOKEN", "se?TOKEN=1"])
def test_a_source_url_with_credentials_gives_a_dag_that_says_so_without_them(
    secret: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its docs reach every viewer (``GET /api/v2/dags/<id>/details``): the pipeline is
    refused, and its stand-in DAG names the problem and its line, never the secret."""
    from trainyard.orchestration.graph import build_dags

    folder = tmp_path / "pipelines"
    folder.mkdir()
    text = (ROOT / "dags" / "pipelines" / "transactions.yaml").read_text(encoding="utf-8")
    original = "url: .trainyard/raw/transactions/{ds}.csv"
    assert original in text
    url = f"http://u:{secret}@host/x.csv"
    (folder / "transactions.yaml").write_text(text.replace(original, f"url: {url}"))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))

    dag = build_dags(folder)["trainyard_transactions"]

    assert dag.task_ids == ["invalid_config"]
    assert "source.url: http://***@host/x.csv: credentials in the URL are refused" in dag.doc_md
    for shown in (dag.doc_md, dag.description or "", repr(dag.params.dump())):
        assert "TOKEN" not in shown
