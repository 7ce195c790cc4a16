"""trainyard as a Python package: pyproject.toml + setup.py build a wheel with its C extensions.

The wheel is built from a copy of the package's sources (so the checkout's own built files
cannot slip in) by this venv's pip and setuptools without build isolation (no download),
then installed without dependencies into a clean venv, where the extensions are loaded
from the installed files with the checkout off ``sys.path``. A build with a compiler that
fails still installs, and says so: at build time (setuptools) and at use (trainyard.native).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import warnings
import zipfile
from pathlib import Path

import pytest

from trainyard import native

ROOT = Path(__file__).resolve().parents[2]
LINUX = sys.platform.startswith("linux")
BUILD_FILES = ["pyproject.toml", "setup.py", *(p.name for p in ROOT.glob("requirements-*.txt"))]

# Run in the clean venv: load each installed extension from its file (importing the
# trainyard subpackages would need the dependencies, which --no-deps leaves out).
PROBE = r"""
import importlib.util, json, sys
from pathlib import Path
import trainyard, trainyard.native as native
root = Path(trainyard.__file__).parent
assert "site-packages" in str(root), root
out = {"root": str(root), "missing": native.missing()}
staging = native.built_path("trainyard.staging._native")
if staging:
    spec = importlib.util.spec_from_file_location("trainyard.staging._native", staging)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out["scan"] = callable(mod.scan) and callable(mod.pack)
library = native.built_path("trainyard.training._loopback")
out["loopback"] = library.read_bytes()[:4] == b"\x7fELF" if library else None
print(json.dumps(out))
"""


def _sources(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_FILES:
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "plugins",
        src / "plugins",
        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"),
    )
    return src


def _wheel(src: Path, dist: Path, env: dict[str, str]) -> tuple[Path, str]:
    flags = ["-v", "--no-deps", "--no-build-isolation", "--no-index"]
    got = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *flags, "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    (wheel,) = dist.glob("trainyard-0.1.0-*.whl")
    return wheel, got.stdout + got.stderr


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("venv") / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(where)
    return where


def _install_and_probe(venv_dir: Path, wheel: Path) -> dict:
    pip = [str(venv_dir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    got = subprocess.run(
        [str(venv_dir / "bin" / "python"), "-c", PROBE],
        cwd=venv_dir,  # not the checkout: only the installed package can be found
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


@pytest.mark.slow
def test_a_wheel_carries_the_package_and_its_built_extensions(
    tmp_path: Path, clean_venv: Path
) -> None:
    wheel, _log = _wheel(_sources(tmp_path), tmp_path / "dist", dict(os.environ))
    names = zipfile.ZipFile(wheel).namelist()
    suffix = r"\.cpython-311-[^/]+\.so"
    for pattern in [
        r"trainyard/__init__\.py",
        r"trainyard/native\.py",
        r"trainyard/k8s/objects\.py",
        r"trainyard/training/worker/__init__\.py",
        r"trainyard/templates/run\.html\.j2",  # the UI pages' templates (package data)
        *([rf"trainyard/staging/_native{suffix}", r"trainyard/training/_loopback\.so"] * LINUX),
    ]:
        assert any(re.fullmatch(pattern, n) for n in names), pattern
    assert not any(n.startswith(("tests/", "dags/", "trainyard_ui")) for n in names)
    meta = zipfile.ZipFile(wheel).read("trainyard-0.1.0.dist-info/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    # the base set is the Airflow image's (no TensorFlow); TF and object stores are extras
    assert "apache-airflow==3.3.2" in requires
    assert 'tensorflow-cpu==2.21.0; extra == "tensorflow"' in requires
    assert 'gcsfs==2026.10.1; extra == "sources"' in requires
    assert not [r for r in requires if r.startswith("tensorflow") and "extra ==" not in r]

    got = _install_and_probe(clean_venv, wheel)
    assert got["missing"] == []
    if LINUX:
        assert got["scan"] is True and got["loopback"] is True


@pytest.mark.slow
def test_a_broken_compiler_still_installs_and_says_what_is_missing(
    tmp_path: Path, clean_venv: Path
) -> None:
    env = {**os.environ, "CC": "false"}  # the compiler runs and fails on every source
    wheel, log = _wheel(_sources(tmp_path), tmp_path / "dist", env)
    for name in native.MODULES.keys() | native.LIBRARIES.keys():
        if LINUX or name not in native.LINUX_ONLY:
            assert f'building extension "{name}" failed' in log, name
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    got = _install_and_probe(clean_venv, wheel)
    if LINUX:
        assert "trainyard.staging._native is not built" in "\n".join(got["missing"])
        assert len(got["missing"]) == len(native.MODULES) + len(native.LIBRARIES), got["missing"]


def test_a_missing_module_warns_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(native.MODULES, "trainyard.serving._absent", "the Python path runs")
    with pytest.warns(RuntimeWarning, match=r"trainyard\.serving\._absent is not built"):
        assert native.load("trainyard.serving._absent") is None


def test_the_checkout_extensions_are_built_and_current() -> None:
    # what `make native` did before the tests ran (pip install -e .: built in place)
    assert native.missing() == [], "run: make native"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (native.load("trainyard.staging._native") is not None) == LINUX


def test_build_files_agree() -> None:
    # requirements.txt (the dev checkout) is exactly the package's base set plus the TF extra
    text = (ROOT / "requirements.txt").read_text()
    assert re.findall(r"^-r (\S+)$", text, re.M) == [
        "requirements-airflow.txt",
        "requirements-tensorflow.txt",
    ]
    airflow = (ROOT / "requirements-airflow.txt").read_text()
    assert not re.search(r"^(tensorflow|tf-keras|tensorboard)", airflow, re.M)
    assert not (ROOT / "scripts" / "build_native.py").exists()
    sources = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "plugins").rglob("*.c"))
    setup = (ROOT / "setup.py").read_text()
    assert all(f'"{s}"' in setup for s in sources), sources
