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


def _module(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
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


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes under ``if TYPE_CHECKING:`` (never run, so never a circle)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def import_edges(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports ANYWHERE in it (functions included).

    An import inside a function runs as surely as one at the top, only later: a circle
    through one is still a circle (three of them hid from a check of the top level only).
    """
    modules = {_module(p, package) for p in package.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        mod = _module(path, package)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
                names = [n if n in modules else node.module for n in names]
            found |= {n for n in names if n in modules and n != mod}
        edges[mod] = found
    return edges


def find_circle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle (``a -> b -> a``), or [] when there is none."""
    state: dict[str, int] = {}

    def visit(mod: str, stack: list[str]) -> list[str]:
        state[mod] = 1
        for dep in sorted(edges.get(mod, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if state.get(dep) is None and (circle := visit(dep, [*stack, dep])):
                return circle
        state[mod] = 2
        return []

    for mod in sorted(edges):
        if state.get(mod) is None and (circle := visit(mod, [mod])):
            return circle
    return []


def test_no_import_circle_even_through_imports_inside_functions() -> None:
    circle = find_circle(import_edges())
    assert circle == [], " -> ".join(circle)


def test_the_circle_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    """The check must be able to fail: a copy of the package with one function-level import
    that closes a circle (steps -> ... -> config -> steps) is caught."""
    import shutil

    copy = tmp_path / "trainyard"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    assert find_circle(import_edges(copy)) == []
    config = copy / "config.py"
    late = "\n\ndef _late() -> None:\n    from trainyard import steps  # noqa: F401\n"
    config.write_text(config.read_text(encoding="utf-8") + late)
    circle = find_circle(import_edges(copy))
    assert "trainyard.steps" in circle and "trainyard.config" in circle, circle


LAYERS: tuple[tuple[str, ...], ...] = (
    # 0: the base every module may use
    ("errors", "settings", "fsutil", "layout", "argtypes", "lognoise", "cpus", "progress",
     "native", "connections", "deadline"),
    # 1: one file's config and contract, parsed and typed
    ("config", "contracts", "regexes", "odcs"),
    # 2: what is stored: snapshots and model versions
    ("volumes", "registry", "fingerprint"),
    # 3: the stages, and what spans pipelines
    ("staging", "validation", "training", "evaluation", "serving", "k8s", "streaming",
     "tracking", "pipelines", "runs", "runview", "metadb", "standalone"),
    # 4: the step table and the pods it renders
    ("steps", "pods"),
    # 5: entry points: the command line and Airflow
    ("cli", "orchestration", "__main__"),
)  # fmt: skip


def _layer(mod: str) -> int:
    top = mod.split(".")[1] if "." in mod else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{mod} is in no layer of test_architecture.LAYERS: give it one")


def test_imports_run_one_way_down_the_layers() -> None:
    """Entry points -> steps -> stages -> storage -> config -> base, counting every import."""
    wrong = sorted(
        f"{mod} (layer {_layer(mod)}) imports {dep} (layer {_layer(dep)})"
        for mod, deps in import_edges().items()
        if mod != "trainyard"
        for dep in deps
        if dep != "trainyard" and _layer(dep) > _layer(mod)
    )
    assert wrong == [], "\n".join(wrong)


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


POD_ENVIRONMENT = {
    "trainyard.training.spec",
    "trainyard.training.worker.main",
    "trainyard.training.worker.tf_config",
    "trainyard.training.launcher",
    "trainyard.streaming.supervisor",
}
"""Modules that read the pod's (or a child process's) environment contract, which the
launcher or supervisor sets for the process it starts: ``TRAINYARD_TF_*``, the attempt,
the parent's pid, test fault injection."""


def _env_reads(tree: ast.Module) -> set[str]:
    """``TRAINYARD_*`` names a module reads from the environment."""
    consts = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value.value, str)
    }

    def name_of(node: ast.AST) -> str | None:
        value = consts.get(node.id) if isinstance(node, ast.Name) else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
        return value if value and value.startswith("TRAINYARD_") else None

    found: set[str] = set()
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func.endswith(("environ.get", "os.getenv", "environ.pop")):
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            arg = node.slice
        if arg is not None and (name := name_of(arg)):
            found.add(name)
    return found


def test_settings_are_read_in_one_module() -> None:
    """Every ``TRAINYARD_*`` setting in :mod:`trainyard.settings` (31 names were read in 8+
    modules); only the pod's environment contract is read where the pod's process runs."""
    readers = {
        _module(path): names
        for path in PACKAGE.rglob("*.py")
        if (names := _env_reads(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert "TRAINYARD_RUNNER" in readers.get("trainyard.settings", set())  # the check sees
    stray = {m: sorted(n) for m, n in readers.items() if m not in POD_ENVIRONMENT | {
        "trainyard.settings"}}  # fmt: skip
    assert stray == {}
