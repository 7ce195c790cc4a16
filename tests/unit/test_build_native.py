"""scripts/build_native.py: builds the C modules, warns without a compiler, fails on errors."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("build_native", ROOT / "scripts/build_native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def decode_copy(tmp_path: Path) -> Path:
    source = tmp_path / "_decode.c"
    shutil.copy(ROOT / "plugins/trainyard/serving/_decode.c", source)
    return source


def test_builds_an_importable_module_once(decode_copy: Path, monkeypatch: pytest.MonkeyPatch):
    build = _script()
    monkeypatch.setenv("CC", "cc")
    assert build.build(decode_copy) == 0
    out = build.target(decode_copy)
    stamp = out.stat().st_mtime_ns
    assert build.build(decode_copy) == 0 and out.stat().st_mtime_ns == stamp  # up to date
    probe = "import _decode; print(_decode.float32_rows(b'[[1,2.5]]', 0, 9, (2,)))"
    got = subprocess.run(
        [sys.executable, "-c", probe], cwd=decode_copy.parent, capture_output=True, text=True
    )
    assert got.stdout.strip() == r"(b'\x00\x00\x80?\x00\x00 @', 1)", got.stderr


def test_no_compiler_warns_and_leaves_the_python_path(
    decode_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("CC", "no-such-cc")
    assert _script().build(decode_copy) == 0
    assert "no C compiler (no-such-cc)" in capsys.readouterr().err
    assert not _script().target(decode_copy).exists()


def test_a_source_that_does_not_compile_fails(decode_copy: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CC", "cc")
    decode_copy.write_text("int broken(\n")
    assert _script().build(decode_copy) == 1
    assert sorted(p.name for p in decode_copy.parent.iterdir()) == ["_decode.c"]


def test_the_repository_modules_are_built():
    # what `make` did before the tests ran: both modules next to their sources
    build = _script()
    for source in build.SOURCES:
        if source.name in build.LINUX_ONLY and not sys.platform.startswith("linux"):
            continue
        out = build.target(source)
        assert out.exists(), f"{out.name} missing: run python scripts/build_native.py"
        assert out.stat().st_mtime_ns >= source.stat().st_mtime_ns, f"{out.name} is stale"
