"""What a pipeline's model server answers now: the served versions, asked, not assumed.

The registry names the champion; a stopped server (``make stop``) serves nothing all the
same. The run summaries (``make run``, ``trainyard run``, ``summary``) and the UI's pages
ask here before saying what is served.
"""

from __future__ import annotations

from typing import Any


def server_answer(pipeline: str, timeout_s: float = 0.5) -> dict[str, Any] | None:
    """What the pipeline's model server answers now, on this machine (the local runner).

    The registry names the champion; a stopped server (``make stop``) serves nothing all
    the same, so the summary and the pipeline page ask the server before saying what is
    served.

    Returns:
        ``address``, and ``versions`` (its AVAILABLE versions of the model) or ``error``
        (why it did not answer); None on a cluster or without a pipeline config.
    """
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
    except (OSError, http.client.HTTPException) as e:
        return {"address": address, "error": str(e) or type(e).__name__}
    except (TypeError, KeyError, ValueError):
        return {"address": address, "error": "not a model server's answer"}
    return {"address": address, "versions": versions}
