"""Where a model is served is resolved once per runner, and every caller uses that.

The bug this guards: deploy and the stream scorer took the host from the environment (the
cluster's Service) but the port from the pipeline YAML, while the Service always listens
on TF Serving's 8501; a laptop user who moved ``serving.port`` to 18501 made deploy and
scoring on the cluster dial a port nothing listens on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.config import PipelineConfig
from trainyard.settings import SERVING_REST_PORT, ServingEndpoint, get_settings, serving_endpoint

ROOT = Path(__file__).resolve().parents[2]


def _pipeline(port: int) -> PipelineConfig:
    import yaml

    doc = yaml.safe_load((ROOT / "dags" / "pipelines" / "transactions.yaml").read_text())
    doc["serving"] |= {"port": port}
    return PipelineConfig.model_validate(doc)


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        (None, ServingEndpoint("127.0.0.1", 18501, local=True)),
        ("tf-serving", ServingEndpoint("tf-serving", SERVING_REST_PORT, local=False)),
        ("transactions-serving.ml.svc", ServingEndpoint(
            "transactions-serving.ml.svc", SERVING_REST_PORT, local=False)),
    ],
    ids=["laptop: the YAML's port", "compose: the Service's", "kubernetes: the Service's"],
)  # fmt: skip
def test_the_yaml_port_is_a_laptops_choice_only(
    service: str | None, expected: ServingEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    if service:
        monkeypatch.setenv("TRAINYARD_SERVING_HOST", service)
    else:
        monkeypatch.delenv("TRAINYARD_SERVING_HOST", raising=False)
    assert serving_endpoint(_pipeline(18501)) == expected


def test_the_cluster_serves_on_the_port_the_endpoint_dials() -> None:
    """The rendered serving Deployment and Service listen where the endpoint dials."""
    from trainyard.k8s import objects
    from trainyard.k8s.profile import load_cluster_profile

    profile = load_cluster_profile(get_settings().cluster_profile)
    service = objects.serving_service(profile, "transactions")
    assert {p.name: p.port for p in service.spec.ports}["http"] == SERVING_REST_PORT
    deployment = objects.serving_deployment(profile, "transactions", 1, 1)
    ports = deployment.spec.template.spec.containers[0].ports
    assert SERVING_REST_PORT in [p.container_port for p in ports]
