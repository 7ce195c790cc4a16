"""The code shows the design: one-way imports, Airflow only in orchestration/, one layout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "plugins" / "trainyard"


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Module → trainyard modules and top-level packages it imports (anywhere in it)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        mod = _module(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        graph[mod] = found
    return graph


def test_airflow_is_imported_only_under_orchestration() -> None:
    offenders = sorted(
        mod
        for mod, found in _imports().items()
        if any(name == "airflow" or name.startswith("airflow.") for name in found)
        and not mod.startswith("trainyard.orchestration")
    )
    assert offenders == []


def _module_level_edges() -> dict[str, set[str]]:
    """Module → trainyard modules it imports at module level (what can make a circle)."""
    modules = {_module(p) for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        mod = _module(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found: set[str] = set()
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found |= {n for n in names if n in modules and n != mod}
        edges[mod] = found
    return edges


def test_no_import_circle_at_module_level() -> None:
    edges = _module_level_edges()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(mod: str, stack: list[str]) -> bool:
        state[mod] = 1
        for dep in sorted(edges.get(mod, ())):
            if state.get(dep) == 1:
                cycle.extend([*stack[stack.index(dep) :], dep] if dep in stack else [mod, dep])
                return True
            if state.get(dep) is None and visit(dep, [*stack, dep]):
                return True
        state[mod] = 2
        return False

    for mod in sorted(edges):
        if state.get(mod) is None and visit(mod, [mod]):
            break
    assert cycle == [], " -> ".join(cycle)


def test_lower_layers_never_import_the_upper_ones() -> None:
    """orchestration -> pods/steps -> stages: no stage module reaches back up."""
    upper = ("trainyard.orchestration", "trainyard.steps", "trainyard.pods", "trainyard.cli")
    for mod, found in _imports().items():
        if mod.startswith(upper) or mod == "trainyard.__main__":
            continue
        bad = sorted(n for n in found if n.startswith(upper))
        assert bad == [], f"{mod} imports {bad}"


def test_no_two_modules_share_a_name_for_different_things() -> None:
    stems: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem.startswith("_"):
            continue
        stems.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    assert not {s: p for s, p in stems.items() if s in ("gate", "models") and len(p) > 1}
    assert not (PACKAGE / "trainer").exists()


# ------------------------------------------------------------------ layout


@pytest.mark.parametrize(
    "run_id", ["..", ".", "../../x", "a/b", "manual__2026-11-22T02:18:41+00:00"]
)
def test_any_run_id_stays_inside_its_folder(tmp_path: Path, run_id: str) -> None:
    from trainyard.layout import Layout, run_key

    layout = Layout(tmp_path)
    key = run_key(run_id)
    assert "/" not in key and key not in (".", "..") and not key.startswith(".")
    for path in (
        layout.work("digits", run_id),
        layout.checkpoints("digits", run_id),
        layout.run_record("digits", run_id),
    ):
        resolved = path.resolve()
        assert resolved.is_relative_to(tmp_path.resolve())
        assert resolved.parent.name in ("runs", ".work", "digits")
    assert run_key("..") != run_key(".")


@pytest.mark.parametrize(
    ("kind", "value"),
    [("dataset", ".."), ("dataset", "."), ("pipeline", "a/b"), ("serving model name", "../../x")],
)
def test_unsafe_names_are_refused_naming_them(kind: str, value: str) -> None:
    from trainyard.errors import ConfigError
    from trainyard.layout import Layout

    layout = Layout(Path("/volumes"))
    call = {
        "dataset": lambda: layout.snapshots(value),
        "pipeline": lambda: layout.models(value),
        "serving model name": lambda: layout.serving_base(value),
    }[kind]
    with pytest.raises(ConfigError, match=f"{kind} {value!r} is not a safe name"):
        call()


def test_register_with_run_id_dotdot_loses_nothing(volume_root: Path) -> None:
    """The data-loss case: a run id of '..' once emptied _models/<pipeline>."""
    models = volume_root / "_models" / "digits"
    (models / "versions" / "1").mkdir(parents=True)
    (models / "champion.json").write_text('{"version": 1}')
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    for run_id in ("..", "."):
        proc = subprocess.run(
            [sys.executable, "-m", "trainyard", "register", "--pipeline", "digits",
             "--snapshot-id", "s1", "--run-id", run_id],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert "holds no SavedModel" in proc.stderr
    assert (models / "versions" / "1").is_dir()
    assert (models / "champion.json").is_file()


def test_a_failing_step_pod_fails_without_retry_naming_the_error(volume_root: Path) -> None:
    """The local runner runs the rendered pod; exit code 3 becomes a deterministic failure."""
    from trainyard.config import load_pipeline
    from trainyard.k8s.profile import load_cluster_profile
    from trainyard.orchestration.runners import StepFailed, run_pod_locally
    from trainyard.pods import step_pod
    from trainyard.settings import get_settings

    settings = get_settings()
    profile = load_cluster_profile(settings.cluster_profile)
    pod = step_pod(
        profile, load_pipeline("digits"), "validate", {"snapshot_id": "0123456789abcdef"}
    )
    lines: list[str] = []
    with pytest.raises(StepFailed) as err:
        run_pod_locally(pod, settings, log=lines.append)
    assert err.value.deterministic is True
    assert "SnapshotError" in str(err.value) and "0123456789abcdef" in str(err.value)
    assert any("-m trainyard validate --pipeline digits --snapshot-id" in ln for ln in lines)


def test_a_step_pod_killed_by_a_signal_says_so(volume_root: Path) -> None:
    """Found by a cold user: a deploy whose process was killed (``kill -9``) failed with
    its last log line as the reason ("INFO ... before the deploy: serving version 11"),
    and nothing said it was killed."""
    from trainyard.config import load_pipeline
    from trainyard.k8s.profile import load_cluster_profile
    from trainyard.orchestration.runners import StepFailed, run_pod_locally
    from trainyard.pods import step_pod
    from trainyard.settings import get_settings

    settings = get_settings()
    profile = load_cluster_profile(settings.cluster_profile)
    pod = step_pod(
        profile, load_pipeline("digits"), "validate", {"snapshot_id": "0123456789abcdef"}
    )
    with pytest.raises(StepFailed) as err:
        run_pod_locally(pod, settings, log=lambda line: None, started=lambda p: p.kill())
    assert err.value.deterministic is False  # a retry may well succeed
    assert "the step's process was killed by SIGKILL" in str(err.value), str(err.value)
