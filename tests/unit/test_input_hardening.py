"""Hostile contracts (alias bombs), credentials in source URLs, corrupt registry metadata.

* A contract or pipeline YAML whose aliases expand without bound is refused at once,
  naming the file.
* Credentials in a source URL (user info, ``?token=``, ``sig=``) never reach the manifest,
  ``snapshots show`` or an error message.
* One corrupt ``metadata.json`` does not break staging of any dataset or ``models list``:
  the version is skipped and named, and retention deletes nothing.
"""

from __future__ import annotations

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

from trainyard import volumes
from trainyard.config import PipelineConfig, load_pipeline
from trainyard.contracts import parse_contract
from trainyard.errors import ConfigError, ContractError, StagingError
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
        ("http://u:TOKEN@host/x.csv", "http://u:***@host/x.csv"),
        ("https://TOKEN@host/x.csv", "https://***@host/x.csv"),
        ("https://host/x.csv?token=TOKEN&day=1", "https://host/x.csv?token=***&day=1"),
        ("https://a.blob/x?sv=1&sig=TOKEN", "https://a.blob/x?sv=***&sig=***"),
        ("s3://b/k.csv?X-Amz-Signature=TOKEN", "s3://b/k.csv?X-Amz-Signature=***"),
        ("/data/raw/x.csv", "/data/raw/x.csv"),
    ],
)
def test_redact_url(url: str, shown: str):
    assert redact_url(url) == shown
    assert "TOKEN" not in redact_text(f"{url}: cannot open source")


class _CsvHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if not self.path.startswith("/tx.csv"):
            self.send_error(404)
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


def pipeline(url: str, retention: int = 7) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "tx",
            "dataset": "tx",
            "start_date": "2026-11-01",
            "source": {"url": url, "format": "csv"},
            "staging": {"retention": retention},
            "training": {"model": "mlp"},
            "serving": {"model_name": "tx"},
        }
    )


def test_credentials_in_the_source_url_are_never_stored_or_printed(
    volume_root: Path, contracts: Path, http_source: str
):
    url = f"http://user:TOKEN1@{http_source}/tx.csv?token=TOKEN2&sig=TOKEN3"
    result = stage(pipeline(url), quiet=True)
    assert result.rows == 50
    stored = (result.path / "manifest.json").read_text()
    assert "TOKEN" not in stored
    assert json.loads(stored)["source"]["url"].startswith(f"http://user:***@{http_source}/")
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
    with pytest.raises(StagingError) as info:
        stage(pipeline(f"http://user:TOKEN1@{http_source}/missing.csv?token=TOKEN2"), quiet=True)
    assert "TOKEN" not in str(info.value) and "user:***@" in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None


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
