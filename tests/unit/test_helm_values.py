"""deploy/helm/values.yaml for the official Airflow Helm chart, checked offline.

What is checked here, without the chart: that the values agree with the rest of trainyard
(images, Airflow version, the cluster profile's namespace, user and CPU pool, the RBAC
service account), hold no secret, set only real Airflow options, and that the Kubernetes
objects inside (the pools init container, the pod security context) are valid core/v1 and
Pod Security "restricted". The chart's own values.schema.json is not in any package this
project installs; with ``AIRFLOW_CHART_SCHEMA`` pointing at one (``helm pull
apache-airflow/airflow --untar`` puts it in ``airflow/values.schema.json``) the file is also
validated against it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard import k8s
from trainyard.k8s import checks

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
PROFILE = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def _pin(path: str, name: str) -> str:
    found = re.search(rf"^{re.escape(name)}==(\S+)$", (ROOT / path).read_text(), re.M)
    assert found, f"{path}: no pin for {name}"
    return found[1]


def test_executor_and_images(values: dict[str, Any]) -> None:
    assert values["executor"] in ("KubernetesExecutor", "CeleryExecutor")
    assert values["airflowVersion"] == _pin("requirements-airflow.txt", "apache-airflow")
    image = values["images"]["airflow"]
    version = re.search(r'^version = "(\S+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    # images/airflow's target airflow (no TensorFlow), the tag compose builds
    assert image["repository"].rsplit("/", 1)[-1] == "trainyard-airflow"
    assert image["tag"] == version
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    assert compose["x-airflow-common"]["image"] == f"trainyard-airflow:{version}"
    assert values["defaultAirflowRepository"] == image["repository"]
    assert values["defaultAirflowTag"] == image["tag"]
    # the steps the task pods launch run from the profile's images, not from this one
    assert PROFILE.images.steps != f"{image['repository']}:{image['tag']}"


def test_dags_and_plugins_come_from_the_image(values: dict[str, Any]) -> None:
    assert values["dags"]["gitSync"]["enabled"] is False
    assert values["dags"]["persistence"]["enabled"] is False
    text = (ROOT / "images" / "airflow" / "Dockerfile").read_text()
    assert "COPY --chown=airflow:root dags/ /opt/airflow/dags/" in text
    assert "/opt/airflow/plugins/trainyard_ui.py" in text


def test_kubernetes_executor_has_no_celery_parts(values: dict[str, Any]) -> None:
    if values["executor"] == "KubernetesExecutor":
        assert values["redis"]["enabled"] is False and values["flower"]["enabled"] is False


def test_cluster_profile_agrees(values: dict[str, Any]) -> None:
    sec = PROFILE.security
    assert (values["uid"], values["gid"]) == (sec.run_as_user, sec.run_as_group)
    pod = values["securityContexts"]["pod"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (
        sec.run_as_user,
        sec.run_as_group,
        sec.fs_group,
    )
    assert values["config"]["kubernetes_executor"]["namespace"] == PROFILE.namespace
    cpu = dict(PROFILE.cpu_pool.node_labels)
    for component in ("workers", "scheduler", "apiServer", "dagProcessor", "triggerer"):
        assert values[component]["nodeSelector"] == cpu, component
    env = {e["name"]: e["value"] for e in values["env"]}
    assert env["TRAINYARD_RUNNER"] == "kubernetes"
    assert env["TRAINYARD_CLUSTER_PROFILE"] == "/opt/airflow/deploy/cluster_profile.yaml"


def test_task_pods_use_the_operator_service_account(values: dict[str, Any]) -> None:
    rbac = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "rbac.yaml").read_text()))
    bound = {
        s["name"]
        for doc in rbac
        if doc and doc["kind"] == "RoleBinding"
        for s in doc["subjects"]
        if s["kind"] == "ServiceAccount" and s["namespace"] == PROFILE.namespace
    }
    sa = values["workers"]["serviceAccount"]
    assert sa["create"] is False and sa["name"] in bound


SECRET_KEYS = ("fernetKey", "apiSecretKey", "jwtSecret", "webserverSecretKey")


def test_no_secret_in_the_file(values: dict[str, Any]) -> None:
    assert not [k for k in SECRET_KEYS if values.get(k)]
    assert "metadataConnection" not in values["data"]
    for key in ("fernetKeySecretName", "apiSecretKeySecretName", "jwtSecretName"):
        assert values[key].startswith("trainyard-")
    assert values["data"]["metadataSecretName"].startswith("trainyard-")
    # connections come from Secrets as AIRFLOW_CONN_<ID>; each named in the header comment
    header = VALUES.read_text().split("\n\n", 1)[0]
    for entry in values["secret"]:
        assert entry["envName"].startswith("AIRFLOW_CONN_")
        assert entry["secretName"] in header and f"`{entry['secretKey']}`" in header
    assert not re.search(r"(?i)password|://[^ ]*:[^ ]*@", VALUES.read_text())


def test_config_options_exist_in_installed_airflow(values: dict[str, Any]) -> None:
    """Every ``config`` option is a real option of the Airflow and providers we pin."""
    from airflow.configuration import conf
    from airflow.providers_manager import ProvidersManager

    described = dict(conf.configuration_description)
    for provider in ProvidersManager().provider_configs:
        described.update(provider[1].get("config", {}))
    for section, options in values["config"].items():
        assert section in described, section
        for option in options:
            assert option in described[section]["options"], f"{section}.{option}"


def test_pools_init_container(values: dict[str, Any]) -> None:
    from trainyard import cli

    (init,) = values["scheduler"]["extraInitContainers"]
    assert init["image"] == f"{values['images']['airflow']['repository']}:0.1.0"
    assert "python -m trainyard pools" in init["args"][0]
    assert "airflow pools import" in init["args"][0]
    assert "pools" in cli.TOOLS
    # the pools come from the profile every other Airflow container reads
    main_env = {e["name"]: e.get("value") for e in values["env"]}
    init_env = {e["name"]: e.get("value") for e in init["env"]}
    for name in ("TRAINYARD_RUNNER", "TRAINYARD_PROJECT_DIR", "TRAINYARD_CLUSTER_PROFILE"):
        assert init_env[name] == main_env[name], name
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "scheduler"},
        "spec": {
            "securityContext": values["securityContexts"]["pod"],
            "initContainers": [init],
            "containers": [
                {
                    "name": "scheduler",
                    "image": init["image"],
                    "securityContext": values["securityContexts"]["container"],
                }
            ],
        },
    }
    # core/v1 (strict: no unknown field) and Pod Security "restricted"
    assert checks.validate_object(pod) == []


CHART_SCHEMA = os.environ.get("AIRFLOW_CHART_SCHEMA")


@pytest.mark.skipif(not CHART_SCHEMA, reason="AIRFLOW_CHART_SCHEMA not set (chart not here)")
def test_against_the_chart_schema(values: dict[str, Any]) -> None:
    import jsonschema

    schema = json.loads(Path(str(CHART_SCHEMA)).read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(values), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
