"""Fixtures every test directory may use (a pytest plugin, loaded by ``tests/conftest.py``).

Session-scoped where a real server can be shared: one Redis server, one database per test
in it. Under pytest-xdist each worker has its own session, so its own server.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def contracts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty contracts folder of the test's own (``TRAINYARD_CONTRACTS_DIR``).

    The test writes the contracts it needs into it.
    """
    folder = tmp_path / "contracts"
    folder.mkdir()
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(folder))
    return folder


@pytest.fixture
def shipped_contracts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``data_contracts/`` the test may change (``TRAINYARD_CONTRACTS_DIR``)."""
    folder = tmp_path / "contracts"
    shutil.copytree(ROOT / "data_contracts", folder)
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's Redis server (Unix socket only), its URL with ``?db=0``."""
    from trainyard.streaming import redis_server

    folder = tmp_path_factory.mktemp("redis")
    url = redis_server.ensure_running(folder)
    try:
        yield url
    finally:
        redis_server.stop(folder)


_databases = itertools.cycle(range(1, 16))


@pytest.fixture
def redis_url(redis_session: str) -> str:
    """A Redis database of the test's own, empty, on the session's server."""
    import redis

    url = redis_session.replace("?db=0", f"?db={next(_databases)}")
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
    return url
