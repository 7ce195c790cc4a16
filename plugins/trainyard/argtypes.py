"""Argument types for the command lines: one clear usage error for a value out of range.

Each takes the option's text and returns the value, or raises
:class:`argparse.ArgumentTypeError`, which argparse reports as ``argument --x: ...`` with
exit code 2.
"""

from __future__ import annotations

import argparse
import math


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
