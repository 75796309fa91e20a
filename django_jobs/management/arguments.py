"""argparse ``type=`` validators shared by the commands: bad values are refused before handle()."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

from django_jobs.names import pool_problem

UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


# Threads (and database connections) one worker process may run at once. Far
# past what one process serves well (a second process scales further), and far
# below where threads cannot be started any more.
MAX_CONCURRENCY = 1000
# runjobworker's --concurrency when none is given: the fewest slots with which
# one process drained short runs faster than PgQueuer's defaults in every
# measurement (docs/performance.md); 18 connections (docs/decisions.md).
DEFAULT_CONCURRENCY = 16


def concurrency(value: str) -> int:
    """``--concurrency``: 1 to ``MAX_CONCURRENCY``."""
    message = f"expected an integer from 1 to {MAX_CONCURRENCY}, got {value!r}"
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(message) from None
    if not 1 <= number <= MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(message)
    return number


# Async runs one worker process may run at once on its event loop: tasks, not
# threads, so far more than MAX_CONCURRENCY; past this one process's loop is the
# bottleneck and a second process serves better.
MAX_ASYNC_CONCURRENCY = 10_000


def async_concurrency(value: str) -> int:
    """``--async-concurrency``: 0 (async handlers run in threads) to ``MAX_ASYNC_CONCURRENCY``."""
    message = f"expected an integer from 0 to {MAX_ASYNC_CONCURRENCY}, got {value!r}"
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(message) from None
    if not 0 <= number <= MAX_ASYNC_CONCURRENCY:
        raise argparse.ArgumentTypeError(message)
    return number


# Longer intervals are mistakes, and past about 292 years a sleep overflows.
MAX_SECONDS = 86_400.0
MAX_AGE = timedelta(days=36_500)


def positive_float(value: str) -> float:
    """Seconds: a positive number up to a day (``--poll-interval``, ``--watch``)."""
    message = f"expected a positive number of seconds up to {MAX_SECONDS:g}, got {value!r}"
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(message) from None
    if not 0 < number <= MAX_SECONDS:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(message)
    return number


def pool_name(value: str) -> str:
    """A pool name: 1-100 characters, no whitespace, no control characters."""
    if pool_problem(value) is not None:
        raise argparse.ArgumentTypeError(
            f"expected a pool name (1-100 characters, no whitespace or control characters), "
            f"got {value!r}"
        )
    return value


def port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {value!r}")
    return int(value)


def duration(value: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``: a positive age up to 100 years."""
    message = f"expected an age such as 30d, 12h, 90m, 45s or 2w, got {value!r}"
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", value)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(message)
    seconds = float(match[1]) * timedelta(**{UNITS[match[2]]: 1}).total_seconds()
    if seconds > MAX_AGE.total_seconds():
        raise argparse.ArgumentTypeError(f"expected an age up to 100 years (36500d), got {value!r}")
    return timedelta(seconds=seconds)


def describe(age: timedelta) -> str:
    """``age`` in the largest unit that divides it: ``30d``, ``12h``, ``90s``."""
    seconds = age.total_seconds()
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
