"""Shared fixtures (more in tests/support/fixtures.py) and an isolated volume root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRAINYARD_PROJECT_DIR", str(ROOT))

pytest_plugins = ["tests.support.fixtures"]


@pytest.fixture
def volume_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh volume root for one test (``TRAINYARD_VOLUME_ROOT``).

    A model server started under it (``models promote`` starts one, detached, to serve
    the champion) is stopped afterwards, so none outlives its test and holds the port.
    """
    root = tmp_path / "volumes"
    root.mkdir()
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(root))
    yield root
    if (root / "_serving").is_dir():
        from trainyard.serving.deploy import stop_local_server

        stop_local_server(root / "_serving")
