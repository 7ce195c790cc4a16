"""``python -m trainyard models ...``: the registry's CLI; serving follows its champion."""

from __future__ import annotations

from trainyard.config import load_pipeline
from trainyard.pipelines import ensure_own_names
from trainyard.settings import get_settings
from trainyard.steps import approval, follow_registry


def models_main(argv: list[str]) -> int:
    """``python -m trainyard models ...``: the registry's CLI; serving follows its champion.

    Args:
        argv: Arguments after ``models``.

    Returns:
        The exit code.
    """
    from trainyard.registry import cli_main

    return cli_main(
        argv, after_move=follow_registry, before_move=_check_before_move, answer=approval
    )


def _check_before_move(pipeline: str) -> None:
    """Refuse ``models promote|rollback`` that serving could not follow: checked first.

    The pipeline's names, and locally its serving port (one taken by something else
    would leave the new champion unserved).
    """
    from trainyard.serving.deploy import check_port_is_ours
    from trainyard.settings import serving_endpoint

    cfg = load_pipeline(pipeline)
    ensure_own_names(cfg)
    endpoint = serving_endpoint(cfg)
    if endpoint.local:
        check_port_is_ours(get_settings().serving_root, endpoint.host, endpoint.port)
