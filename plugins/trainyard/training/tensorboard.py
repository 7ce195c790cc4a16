"""``python -m trainyard tensorboard --pipeline P``: a pipeline's training curves in TensorBoard.

The chief of every training run writes TensorBoard event files into its output
(``tensorboard/``, :data:`trainyard.training.spec.TENSORBOARD_DIR`), which ``register``
copies into the version. This command serves them as one TensorBoard bound to 127.0.0.1
unless ``--host`` says otherwise: by default the pipeline's two roots, so versions
registered and runs started while it is open appear at its next reload
(``versions/<N>/...`` and ``running/<run>/...``); with ``--version`` those versions only
(``v<N>``, the champion marked ``v<N>-champion``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from trainyard import argtypes
from trainyard.errors import ConfigError
from trainyard.training.spec import TENSORBOARD_DIR


def _roots(pipeline: str) -> tuple[str, Path, Path]:
    """The pipeline's name (checked), its versions folder and its running runs' folder."""
    from trainyard.config import load_pipeline
    from trainyard.layout import CHECKPOINTS_DIR, Layout, safe_name
    from trainyard.settings import get_settings

    cfg = load_pipeline(pipeline)
    root = get_settings().volume_root
    versions = Path(Layout(root).models(cfg.name)) / "versions"
    running = Path(root) / CHECKPOINTS_DIR / safe_name("pipeline", cfg.name)
    return cfg.name, versions, running


def event_dirs(pipeline: str, versions: list[int] | None = None) -> dict[str, Path]:
    """The pipeline's TensorBoard runs now: name → folder of event files.

    Args:
        pipeline: Pipeline name (must have a config).
        versions: Only these versions (default: every version, and the runs in progress).

    Returns:
        ``v<N>`` (``v<N>-champion``) for registered versions, oldest first, then
        ``running-<run key>`` for training runs not registered yet (none may exist yet).

    Raises:
        ConfigError: For an unknown pipeline, or a version that does not exist or has no
            event files.
    """
    from trainyard.registry import Registry
    from trainyard.settings import get_settings

    name, _, running = _roots(pipeline)
    reg = Registry(get_settings().models_root, name)
    champion = reg.champion()
    known = reg.list_versions()
    runs: dict[str, Path] = {}
    for v in versions if versions is not None else known:
        if v not in known:
            raise ConfigError(
                f"pipeline {name!r} has no version {v} (versions: "
                f"{', '.join(map(str, known)) or 'none'})"
            )
        path = reg.version_dir(v) / TENSORBOARD_DIR
        if path.is_dir():
            runs[f"v{v}-champion" if v == champion else f"v{v}"] = path
        elif versions is not None:
            raise ConfigError(
                f"version {v} of {name!r} has no TensorBoard event files "
                f"(it was registered before trainyard wrote them, or not by a training run)"
            )
    if versions is None:
        for path in sorted(running.glob(f"*/output/{TENSORBOARD_DIR}")):
            runs[f"running-{path.parent.parent.name}"] = path
    return runs


def logdir_spec(runs: dict[str, Path]) -> str:
    """TensorBoard's ``--logdir_spec`` for named folders (``name:path,...``).

    Raises:
        ConfigError: For a path with a comma (the spec's separator).
    """
    for path in runs.values():
        if "," in str(path):
            raise ConfigError(f"{path}: TensorBoard cannot serve a folder whose path has a comma")
    return ",".join(f"{name}:{path}" for name, path in runs.items())


def _check_free(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
    except OSError as e:
        raise ConfigError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


def cli_main(argv: list[str]) -> int:
    """Serve a pipeline's event files with TensorBoard (or print where they are).

    Args:
        argv: Arguments after ``tensorboard``.

    Returns:
        The exit code (TensorBoard replaces this process unless ``--print``).
    """
    parser = argtypes.ArgumentParser(
        prog="python -m trainyard tensorboard",
        description="Open a pipeline's training curves (every version, and runs in progress).",
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument(
        "--version", type=argtypes.version, action="append", help="only this version (repeatable)"
    )
    parser.add_argument("--port", type=argtypes.port, default=6006)
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default: this machine only)"
    )
    parser.add_argument(
        "--print", action="store_true", help="print the runs and folders; do not serve"
    )
    args = parser.parse_args(argv)
    runs = event_dirs(args.pipeline, args.version)
    if args.print:
        for name, path in runs.items():
            print(f"{name}\t{path}")
        if not runs:
            print(f"{args.pipeline}: no event files yet (training runs write them)")
        return 0
    if args.version:
        spec = logdir_spec(runs)
    else:
        _, versions, running = _roots(args.pipeline)
        spec = logdir_spec({"versions": versions, "running": running})
    _check_free(args.host, args.port)
    print(f"TensorBoard for {args.pipeline}: http://{args.host}:{args.port}/", flush=True)
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir_spec", spec]
    os.execv(sys.executable, [*cmd, "--host", args.host, "--port", str(args.port)])
    return 0  # pragma: no cover (execv does not return)
