"""Hostile contracts (alias bombs), credentials in source URLs, corrupt registry metadata.

* A contract or pipeline YAML whose aliases expand without bound is refused at once,
  naming the file.
* Credentials in a source URL (user info, ``?token=``, ``sig=``) never reach the manifest,
  ``snapshots show`` or an error message.
* One corrupt ``metadata.json`` does not break staging of any dataset or ``models list``:
  the version is skipped and named, and retention deletes nothing.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from trainyard import volumes
from trainyard.config import PipelineConfig, load_pipeline
from trainyard.contracts import parse_contract
from trainyard.errors import ConfigError, ContractError, SourceUnreadable
from trainyard.fsutil import YAMLTooLarge, load_yaml, redact_text, redact_url
from trainyard.staging import stage

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

CONTRACT = """\
dataset: tx
version: 1.0.0
owner: tests@example.com
source: {format: csv}
roles: {key: id, label: y, features: [x], num_classes: 2}
split: {holdout_fraction: 0.2, by: id}
columns:
  - {name: id, type: string}
  - {name: x, type: float64}
  - {name: y, type: int64}
"""
CSV = "id,x,y\n" + "".join(f"r{i},{i}.5,{i % 2}\n" for i in range(50))


def billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- alias bombs


def test_billion_laughs_contract_is_refused_fast_naming_the_file(tmp_path: Path):
    path = tmp_path / "tx.yaml"
    path.write_text(CONTRACT + billion_laughs())
    t0 = time.perf_counter()
    with pytest.raises(ContractError) as info:
        parse_contract(path)
    assert time.perf_counter() - t0 < 1.0
    assert str(path) in str(info.value)
    assert "aliases" in str(info.value) and "expand to more than" in str(info.value)


def test_billion_laughs_pipeline_config_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(tmp_path))
    path = tmp_path / "p.yaml"
    path.write_text("name: p\n" + billion_laughs())
    with pytest.raises(ConfigError, match=f"{path}: .*aliases"):
        load_pipeline("p")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("a: &a [*a]\n", False),
        ("base: &b {x: 1}\nm: {<<: *b, y: 2}\nn: *b\n", True),
        (billion_laughs(4), True),
        (billion_laughs(6), False),
    ],
    ids=["recursive", "merge-key", "small-fan-out", "large-fan-out"],
)
def test_alias_bound(text: str, ok: bool):
    if ok:
        assert load_yaml(text, "doc.yaml") is not None
    else:
        with pytest.raises(YAMLTooLarge, match=r"doc\.yaml: refused"):
            load_yaml(text, "doc.yaml")


# ----------------------------------------------------------------- credentials in URLs


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:TOKEN@host/x.csv", "http://***@host/x.csv"),
        ("https://TOKEN@host/x.csv", "https://***@host/x.csv"),
        # a secret holding / # ? @ (about half of real AWS secret keys hold a /)
        ("s3://AKIAEXAMPLE:wJa/TOKEN+K@bucket/x.csv", "s3://***@bucket/x.csv"),
        ("s3://AKIAEXAMPLE:se#TOKEN@bucket/x.csv", "s3://***@bucket/x.csv"),
        ("s3://AKIAEXAMPLE:se?TOKEN=1@bucket/x.csv", "s3://***@bucket/x.csv"),
        ("s3://AKIAEXAMPLE:a@TOKEN@bucket/x.csv", "s3://***@bucket/x.csv"),
        ("gs://bucket/me@example.com/x.csv", "gs://bucket/me@example.com/x.csv"),
        ("https://host/x.csv?token=TOKEN&day=1", "https://host/x.csv?token=***&day=1"),
        ("https://a.blob/x?sv=1&sig=TOKEN", "https://a.blob/x?sv=***&sig=***"),
        ("s3://b/k.csv?X-Amz-Signature=TOKEN", "s3://b/k.csv?X-Amz-Signature=***"),
        ("/data/raw/x.csv", "/data/raw/x.csv"),
    ],
)
def test_redact_url(url: str, shown: str):
    assert redact_url(url) == shown
    assert "TOKEN" not in redact_text(f"{url}: cannot open source")
    assert "TOKEN" not in redact_text(f"'{url}' (from {url!r})")


def test_a_known_secret_is_masked_where_a_library_quotes_it_without_its_url():
    from botocore.exceptions import ParamValidationError

    message = str(ParamValidationError(report='Invalid bucket name "AKIA:wJa/TOKEN+K@b"'))
    assert "wJa/TOKEN+K" in message  # what botocore prints: the secret, no scheme
    assert "TOKEN" not in redact_text(message, secrets=["wJa/TOKEN+K", ""])


class _CsvHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if not self.path.startswith("/tx.csv"):
            self.send_error(404)
            return
        if self.path.startswith("/tx.csv?day") and self.headers.get("Authorization") != (
            "Basic " + base64.b64encode(b"reader:se/cr#et?TOKEN").decode()
        ):
            self.send_error(401)
            return
        data = CSV.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/csv")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_source() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CsvHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def contracts(contracts_dir: Path) -> Path:
    folder = contracts_dir
    (folder / "tx.yaml").write_text(CONTRACT)
    return folder


def pipeline(url: str, retention: int = 7, conn_id: str | None = None) -> PipelineConfig:
    source = {"url": url, "format": "csv", **({"conn_id": conn_id} if conn_id else {})}
    return PipelineConfig.model_validate(
        {
            "name": "tx",
            "dataset": "tx",
            "start_date": "2026-11-01",
            "source": source,
            "staging": {"retention": retention},
            "training": {"model": "mlp"},
            "serving": {"model_name": "tx"},
        }
    )


@pytest.mark.parametrize("secret", ["plainTOKEN", "wJa/TOKEN+K", "se#TOKEN", "se?TOKEN=1"])
def test_a_source_url_with_credentials_is_refused_at_its_line(
    secret: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The project's own docs showed ``s3://KEY:SECRET@bucket``: it reached the run note,
    task logs, run page and failure record whole, and a secret with ``/``, ``#`` or ``?``
    was not even masked. Now it never loads; the error names the line, not the secret."""
    url = f"s3://AKIAEXAMPLE:{secret}@bucket/tx/{{ds}}.csv"
    with pytest.raises(ValueError, match=r"s3://\*\*\*@bucket/tx/\{ds\}\.csv: credentials"):
        pipeline(url)
    folder = tmp_path / "pipelines"
    folder.mkdir()
    lines = yaml.safe_dump(
        pipeline("/data/tx/{ds}.csv").model_dump(mode="json", exclude_unset=True)
    )
    (folder / "tx.yaml").write_text(lines.replace("/data/tx/{ds}.csv", url))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(folder))
    check = subprocess.run(
        [sys.executable, "-m", "trainyard", "pipelines", "check"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=PLUGINS,
        timeout=120,
    )
    out = check.stdout + check.stderr
    assert check.returncode != 0, out
    line = next(i for i, t in enumerate(lines.splitlines(), 1) if "url:" in t)
    assert f"tx.yaml:{line}: source.url: s3://***@bucket/tx/{{ds}}.csv: credentials" in out
    assert "TOKEN" not in out and "AKIAEXAMPLE" not in out


@pytest.fixture
def reader_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection in its environment form, as the local runner hands it over."""
    fields = {"conn_type": "http", "login": "reader", "password": "se/cr#et?TOKEN"}
    monkeypatch.setenv("AIRFLOW_CONN_TX_SOURCE", json.dumps(fields))
    return "tx_source"


def test_credentials_come_from_the_airflow_connection_and_never_show(
    volume_root: Path, contracts: Path, http_source: str, reader_conn: str,
    monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    url = f"http://{http_source}/tx.csv?day=1&token=TOKEN2&sig=TOKEN3"
    result = stage(pipeline(url, conn_id=reader_conn), quiet=True)
    assert result.rows == 50
    stored = (result.path / "manifest.json").read_text()
    assert "TOKEN" not in stored and "se/cr" not in stored
    assert json.loads(stored)["source"]["url"].startswith(f"http://{http_source}/tx.csv?day=1")
    show = subprocess.run(
        [sys.executable, "-m", "trainyard", "snapshots", "show", "tx", result.snapshot_id],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=PLUGINS,
        timeout=120,
    )
    assert show.returncode == 0, show.stderr
    assert "TOKEN" not in show.stdout + show.stderr
    # the server refuses the connection's credentials: one clear error, not retried
    fields = {"conn_type": "http", "login": "reader", "password": "wr/ong#TOKEN"}
    monkeypatch.setenv("AIRFLOW_CONN_TX_SOURCE", json.dumps(fields))
    with pytest.raises(SourceUnreadable) as info:
        stage(pipeline(url, conn_id=reader_conn), quiet=True, restage=True)
    assert "401" in str(info.value) and "a retry would fail alike" in str(info.value)
    assert "TOKEN" not in str(info.value) and "wr/ong" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None
    from trainyard.steps import deterministic

    assert deterministic(info.value)
    # a connection the step was not given: said, naming where it looks
    monkeypatch.delenv("AIRFLOW_CONN_TX_SOURCE")
    with pytest.raises(SourceUnreadable, match="no AIRFLOW_CONN_TX_SOURCE in its environment"):
        stage(pipeline(url, conn_id=reader_conn), quiet=True)


# ----------------------------------------------------------------- registry blast radius


def _register(root: Path, pipeline_name: str, version: int, meta: str) -> None:
    path = root / "_models" / pipeline_name / "versions" / str(version) / "metadata.json"
    path.parent.mkdir(parents=True)
    path.write_text(meta)


def test_one_corrupt_version_breaks_neither_staging_nor_models_list(
    volume_root: Path, contracts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRAINYARD_MODELS_ROOT", str(volume_root / "_models"))
    _register(volume_root, "other", 1, "{broken")
    _register(volume_root, "other", 2, json.dumps({"dataset": "x", "snapshot_id": "ab" * 8}))
    ids = []
    for day in range(3):
        src = tmp_path / f"tx{day}.csv"
        src.write_text(CSV.replace("r1,", f"d{day},"))
        ids.append(stage(pipeline(str(src), retention=1), quiet=True).snapshot_id)
    # retention could not tell which snapshot version 1 was trained on: nothing deleted
    assert sorted(m.snapshot_id for m in volumes.list_snapshots("tx")) == sorted(ids)
    proc = subprocess.run(
        [sys.executable, "-m", "trainyard", "models", "list", "--pipeline", "other"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=PLUGINS,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "abababababababab" in proc.stdout
    assert "unreadable, skipped: version 1:" in proc.stdout
    assert "versions/1/metadata.json" in proc.stdout
