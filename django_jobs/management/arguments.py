"""argparse ``type=`` validators shared by the commands: bad values are refused before handle()."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, got {value!r}"
        ) from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return number


def pool_name(value: str) -> str:
    if not value.strip() or len(value) > 100:
        raise argparse.ArgumentTypeError(f"expected a pool name (1-100 characters), got {value!r}")
    return value


def port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {value!r}")
    return int(value)


def duration(value: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``: a positive age."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", value)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected an age such as 30d, 12h, 90m, 45s or 2w, got {value!r}"
        )
    return timedelta(**{UNITS[match[2]]: float(match[1])})


def describe(age: timedelta) -> str:
    """``age`` in the largest unit that divides it: ``30d``, ``12h``, ``90s``."""
    seconds = age.total_seconds()
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
