"""CPU serving: a TF-Serving-compatible REST server and the deploy step.

* :mod:`trainyard.serving.server`: aiohttp server and ``trainyard serve``.
* :mod:`trainyard.serving.versions`: version discovery, loading, warm-up, hot swap, batching.
* :mod:`trainyard.serving.schema`: request checks against the contract's feature spec.
* :mod:`trainyard.serving.deploy`: publish, wait, smoke-test, roll back; local server process.
* :mod:`trainyard.serving.client`: a small stdlib HTTP client.

Import the submodule you need; this package imports nothing heavy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig


def serving_host(cfg: PipelineConfig) -> str:
    """The host a pipeline's model server is reached at.

    ``TRAINYARD_SERVING_HOST`` when set (a pod reaches the cluster's serving Service),
    else ``serving.host``; when it is ``serving.host`` the server is local and trainyard
    starts it.

    Args:
        cfg: The pipeline.

    Returns:
        A host name or address.
    """
    return os.environ.get("TRAINYARD_SERVING_HOST") or cfg.serving.host
