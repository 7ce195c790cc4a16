"""What a pipeline's model server answers now: the served versions, asked, not assumed.

The registry names the champion; a stopped server (``make stop``) serves nothing all the
same. The run summaries (``make run``, ``trainyard run``, ``summary``) and the UI's pages
ask here before saying what is served.
"""

from __future__ import annotations

import threading
import time
from typing import Any

_ANSWERS: dict[str, tuple[float, dict[str, Any] | None]] = {}
_ANSWERS_LOCK = threading.Lock()
ANSWER_TTL_S = 2.0
"""How long a server's answer stands for the pages: many views of a slow server ask once."""


def server_answer(pipeline: str, timeout_s: float = 0.5) -> dict[str, Any] | None:
    """What the pipeline's model server answers now, on this machine (the local runner).

    The registry names the champion; a stopped server (``make stop``) serves nothing all
    the same, so the summaries and the pipeline page ask the server before saying what is
    served. The ask takes ``timeout_s`` at most in all (a server answering a byte at a time
    held each page view, and 50 views froze Airflow's API server), and its answer stands for
    :data:`ANSWER_TTL_S` seconds.

    Returns:
        ``address``, and ``versions`` (its AVAILABLE versions of the model) or ``error``
        (why it did not answer); None on a cluster or without a pipeline config.
    """
    now = time.monotonic()
    with _ANSWERS_LOCK:
        cached = _ANSWERS.get(pipeline)
        if cached is not None and now - cached[0] < ANSWER_TTL_S:
            return cached[1]
        if cached is not None:  # while one view asks again, the others take the last answer
            _ANSWERS[pipeline] = (now, cached[1])
    answer = _ask_server(pipeline, timeout_s)
    with _ANSWERS_LOCK:
        _ANSWERS[pipeline] = (time.monotonic(), answer)
    return answer


def _ask_server(pipeline: str, timeout_s: float) -> dict[str, Any] | None:
    import http.client

    from trainyard.config import load_pipeline
    from trainyard.errors import ConfigError
    from trainyard.serving.client import ServingClient, ServingHTTPError
    from trainyard.settings import get_settings, serving_endpoint

    if get_settings().runner != "local":
        return None
    try:
        cfg = load_pipeline(pipeline)
    except ConfigError:
        return None
    endpoint = serving_endpoint(cfg)
    address = endpoint.address
    try:
        with ServingClient(endpoint.host, endpoint.port, timeout=timeout_s) as client:
            entries = client.status(cfg.serving.model_name)
        versions = sorted(
            int(e["version"]) for e in entries if isinstance(e, dict) and e["state"] == "AVAILABLE"
        )
    except ServingHTTPError as e:
        return {"address": address, "versions": [], "error": f"HTTP {e.status}"}
    except (OSError, http.client.HTTPException) as e:  # TimeoutError included
        return {"address": address, "error": str(e) or type(e).__name__}
    except (TypeError, KeyError, ValueError):
        return {"address": address, "error": "not a model server's answer"}
    return {"address": address, "versions": versions}
