"""``python -m trainyard <command> ...``: one entry point for every step and tool.

Each command lives with its stage as a ``cli_main(argv) -> int`` function, imported only
when that command runs, so ``--help`` and unrelated commands stay fast.
"""

from __future__ import annotations

import importlib
import logging
import sys

from trainyard.errors import TrainyardError

COMMANDS: dict[str, tuple[str, str]] = {
    "stage": ("trainyard.steps", "Stage a pipeline's raw source into a dataset snapshot."),
    "validate": ("trainyard.steps", "Validate a snapshot against its data contract."),
    "train": ("trainyard.steps", "Train a candidate model with N local TensorFlow workers."),
    "evaluate": ("trainyard.steps", "Evaluate a candidate against the champion and gate it."),
    "deploy": ("trainyard.steps", "Publish the promoted model to serving and smoke-test it."),
    "run": ("trainyard.steps", "Run every step of a pipeline in this process, in order."),
    "summary": ("trainyard.steps", "Print the summary of a pipeline's last run."),
    "snapshots": ("trainyard.volumes", "list | show | verify | mirror | gc dataset snapshots."),
    "contracts": ("trainyard.contracts", "check data contracts against the JSON schema."),
    "models": ("trainyard.registry", "list | show | promote | rollback model versions."),
    "serve": ("trainyard.serving.server", "Run the TF-Serving-compatible REST server."),
    "render": ("trainyard.k8s", "Render a step's Kubernetes objects as YAML."),
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    rows = "\n".join(f"  {c.ljust(width)}  {h}" for c, (_, h) in COMMANDS.items())
    return f"usage: python -m trainyard <command> [args]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a command's ``cli_main``.

    Args:
        argv: Arguments without the program name (defaults to ``sys.argv[1:]``).

    Returns:
        The process exit code: 0 success, 1 a trainyard error (one clear line), 2 usage.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        sys.stderr.write(f"unknown command {command!r}\n\n{_usage()}")
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    module = importlib.import_module(COMMANDS[command][0])
    try:
        if module.__name__ == "trainyard.steps":
            return int(module.cli_main([command, *rest]))
        return int(module.cli_main(rest))
    except TrainyardError as e:
        sys.stderr.write(f"trainyard {command}: {type(e).__name__}: {e}\n")
        return 1
