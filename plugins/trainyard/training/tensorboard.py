"""``python -m trainyard tensorboard --pipeline P``: a pipeline's training curves in TensorBoard.

The chief of every training run writes TensorBoard event files into its output
(``tensorboard/``, :data:`trainyard.training.spec.TENSORBOARD_DIR`), which ``register``
copies into the version. This command serves, as one TensorBoard, every registered
version (``v<N>``, the champion marked ``v<N>-champion``) and every run still training
(``running-<run>``), bound to 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainyard.errors import ConfigError, RegistryError
from trainyard.training.spec import TENSORBOARD_DIR


def event_dirs(pipeline: str, versions: list[int] | None = None) -> dict[str, Path]:
    """The pipeline's TensorBoard runs: name → folder of event files.

    Args:
        pipeline: Pipeline name (must have a config).
        versions: Only these versions (default: every version, and the runs in progress).

    Returns:
        ``v<N>`` (``v<N>-champion``) for registered versions, oldest first, then
        ``running-<run key>`` for training runs not registered yet.

    Raises:
        ConfigError: For an unknown pipeline.
        RegistryError: For a version that does not exist or has no event files, or when
            the pipeline has none at all.
    """
    from trainyard.config import load_pipeline
    from trainyard.layout import CHECKPOINTS_DIR, safe_name
    from trainyard.registry import Registry
    from trainyard.settings import get_settings

    cfg = load_pipeline(pipeline)
    settings = get_settings()
    reg = Registry(settings.models_root, cfg.name)
    champion = reg.champion()
    known = reg.list_versions()
    runs: dict[str, Path] = {}
    for v in versions if versions is not None else known:
        if v not in known:
            raise RegistryError(
                f"pipeline {cfg.name!r} has no version {v} (versions: "
                f"{', '.join(map(str, known)) or 'none'})"
            )
        path = reg.version_dir(v) / TENSORBOARD_DIR
        if path.is_dir():
            runs[f"v{v}-champion" if v == champion else f"v{v}"] = path
        elif versions is not None:
            raise RegistryError(
                f"version {v} of {cfg.name!r} has no TensorBoard event files "
                f"(it was registered before trainyard wrote them, or not by a training run)"
            )
    if versions is None:
        work = Path(settings.volume_root) / CHECKPOINTS_DIR / safe_name("pipeline", cfg.name)
        for path in sorted(work.glob(f"*/output/{TENSORBOARD_DIR}")):
            runs[f"running-{path.parent.parent.name}"] = path
    if not runs:
        raise RegistryError(
            f"pipeline {cfg.name!r} has no TensorBoard event files yet: "
            f"they are written by training runs (python -m trainyard run --pipeline {cfg.name})"
        )
    for path in runs.values():
        if "," in str(path):
            raise ConfigError(f"{path}: TensorBoard cannot serve a folder whose path has a comma")
    return runs


def logdir_spec(runs: dict[str, Path]) -> str:
    """TensorBoard's ``--logdir_spec`` for named runs (``name:path,...``)."""
    return ",".join(f"{name}:{path}" for name, path in runs.items())


def cli_main(argv: list[str]) -> int:
    """Serve a pipeline's event files with TensorBoard (or print where they are).

    Args:
        argv: Arguments after ``tensorboard``.

    Returns:
        The exit code (TensorBoard replaces this process unless ``--print``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m trainyard tensorboard",
        description="Open a pipeline's training curves (every version, and runs in progress).",
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument(
        "--version", type=int, action="append", help="only this version (repeatable)"
    )
    parser.add_argument("--port", type=int, default=6006)
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
        return 0
    cmd = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir_spec",
        logdir_spec(runs),
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    print(f"TensorBoard for {args.pipeline}: http://{args.host}:{args.port}/", flush=True)
    os.execv(sys.executable, cmd)
    return 0  # pragma: no cover (execv does not return)
