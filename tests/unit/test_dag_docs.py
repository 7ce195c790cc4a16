"""The DAG docs never show credentials written into a pipeline's source URL."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
URL = "http://u:TOKEN@host/x.csv"


def test_source_url_credentials_are_redacted_in_the_dag_docs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.orchestration.graph import build_dags

    folder = tmp_path / "pipelines"
    folder.mkdir()
    text = (ROOT / "dags" / "pipelines" / "transactions.yaml").read_text(encoding="utf-8")
    original = "url: .trainyard/raw/transactions/{ds}.csv"
    assert original in text
    (folder / "transactions.yaml").write_text(text.replace(original, f"url: {URL}"))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))

    dag = build_dags(folder)["trainyard_transactions"]

    assert "train" in dag.task_ids, dag.doc_md  # the real DAG, not the invalid-config stand-in
    assert "`http://u:***@host/x.csv` (csv)" in dag.doc_md
    for shown in (dag.doc_md, dag.description or "", repr(dag.params.dump())):
        assert "TOKEN" not in shown
