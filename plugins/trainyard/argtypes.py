"""The command lines' parser and argument types: one clear usage error for each mistake.

Each type takes the option's text and returns the value, or raises
:class:`argparse.ArgumentTypeError`, which argparse reports as ``argument --x: ...`` with
exit code 2. :class:`ArgumentParser` names a mistyped option before a missing one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, reporting a mistyped option as such, with the nearest one.

    argparse checks required options before unknown ones, so ``--pipline digits`` was
    reported as "the following arguments are required: --pipeline". This parser reports
    ``unrecognized argument: --pipline (did you mean --pipeline?)`` instead. Subparsers
    it creates are of this class too.
    """

    _seen: list[str]

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Remember the arguments, for :meth:`error`, then parse them as argparse does."""
        self._seen = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        """Parse as argparse does; an argument no parser took names the first, suggesting."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            if extras[0].startswith("--"):
                chosen = self._chosen(parsed)
                chosen.error(chosen._unrecognized(extras[0].split("=", 1)[0]))
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> ArgumentParser:
        """The (sub)command's parser that parsed ``parsed``: its options are the ones meant."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest:
                chosen = action.choices.get(getattr(parsed, action.dest, None))
                if isinstance(chosen, ArgumentParser):
                    return chosen._chosen(parsed)
        return self

    def _long_options(self) -> list[str]:
        return [o for o in self._option_string_actions if o.startswith("--")]

    def _unrecognized(self, name: str) -> str:
        import difflib  # an error path: not loaded when Airflow parses the DAGs

        near = difflib.get_close_matches(name, self._long_options(), n=1)
        return f"unrecognized argument: {name}" + (f" (did you mean {near[0]}?)" if near else "")

    def error(self, message: str) -> NoReturn:
        """Exit 2 with ``message``; a missing option first names an unknown one given."""
        if message.startswith("the following arguments are required") and not self._subparsers:
            known = self._long_options()
            for arg in getattr(self, "_seen", []):
                if arg == "--":
                    break
                name = arg.split("=", 1)[0]
                if name.startswith("--") and not any(o.startswith(name) for o in known):
                    message = self._unrecognized(name)
                    break
        super().error(message)


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    value = int(_number(text, int))
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not in 1..65535")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port, or 0 for any free one."""
    value = int(_number(text, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not in 0..65535 (0: any free port)")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def version(text: str) -> int:
    """A model version number: versions start at 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"version {value}: versions start at 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0."""
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def day(text: str) -> dt.date:
    """A calendar day written ``YYYY-MM-DD``."""
    if len(text) != 10 or not all(text[i].isdigit() for i in (0, 1, 2, 3, 5, 6, 8, 9)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a day written YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(text)
    except ValueError as e:  # written so, but no such day (2026-11-31)
        raise argparse.ArgumentTypeError(f"{text!r} is no calendar day ({e})") from None
