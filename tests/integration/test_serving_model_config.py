"""TF Serving's model config file: what trainyard writes, and what it refuses as TF Serving does."""

from __future__ import annotations

import logging
import shutil

import pytest

from tests.support.serving import IMAGE_SPEC, ThreadedServer, build_image_model
from trainyard.errors import DeployError
from trainyard.serving import model_config
from trainyard.serving.deploy import publish_version


def _config(*entries: str) -> str:
    return "model_config_list {\n" + "\n".join(f"  config {{ {e} }}" for e in entries) + "\n}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_config('name: "a" base_path: "/x"', 'name: "a" base_path: "/y"'),
         "illegal to list model 'a' multiple times"),
        (_config('name: "a"'), "model 'a' has no base_path"),
        (_config('base_path: "/x"'), "a model without a name"),
        (_config('name: "a" base_path: "/x" model_version_policy { specific { versions: 1 } } '
                 'version_labels { key: "stable" value: 9 }'),
         "version labels name versions the policy does not serve ([9]; served: [1])"),
    ],
    ids=["twice", "no base path", "no name", "label to an unserved version"],
)  # fmt: skip
def test_configs_tf_serving_refuses_are_refused(text, message):
    """Found by a new user: the last of two same-named entries won, a label to an unloaded
    version answered 404, a missing base_path unloaded the model without a word."""
    with pytest.raises(DeployError) as err:
        model_config.parse(text, "models.config")
    assert message in str(err.value)


def test_a_bad_config_keeps_the_previous_one_and_says_so_once(tmp_path, caplog):
    base = tmp_path / "serving"
    build_image_model(tmp_path / "m", seed=0)
    publish_version(tmp_path / "m", base, "digits", 1, IMAGE_SPEC)
    model_config.set_served(base, "digits", [1], {"stable": 1})
    config = model_config.ensure_config(base)
    srv = ThreadedServer(base, poll_interval=3600, config_file=config)
    try:
        srv.sync()
        assert srv.server.repository.get("digits").version == 1
        config.write_text(
            _config(
                f'name: "digits" base_path: "{base / "digits"}"', 'name: "digits" base_path: "/y"'
            )
        )
        with caplog.at_level(logging.ERROR, logger="trainyard.serving"):
            srv.sync()
            srv.sync()
        errors = [r for r in caplog.records if "keeping the previous model config" in r.message]
        assert len(errors) == 1, errors
        assert srv.server.repository.get("digits").version == 1
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)
