"""What ``JobContext`` needs beside the context itself: its run logger, the checks of
a progress report, and the records of durable waits (deadlines, outcomes)."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .exceptions import (
    ChildRunCanceled,
    ChildRunError,
    ChildRunFailed,
    ChildRunTimedOut,
    EventTimeout,
)
from .models import JobRun, Status
from .payloads import printable


class Suspended(BaseException):
    """Unwinds a handler whose run now waits (children, sleep); the wait is recorded.

    A BaseException, so a handler's ``except Exception`` does not swallow it.
    """


class LeaseLost(BaseException):
    """Unwinds a handler whose run was taken from this worker: nothing more is written."""


# ``wait_for_event`` without a ``default``: its timeout raises ``EventTimeout``.
NO_DEFAULT: Any = object()


class RunLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefix a handler's log lines with its run id and job type."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None
        return f"run={self.extra['run_id']} type={self.extra['job_type']} {msg}", kwargs


CHILD_ERRORS: dict[str, type[ChildRunError]] = {
    Status.FAILED: ChildRunFailed,
    Status.TIMED_OUT: ChildRunTimedOut,
    Status.CANCELED: ChildRunCanceled,
}


# Seconds between two writes of a run's progress (see JobContext.set_progress).
PROGRESS_INTERVAL = 1.0
MAX_PROGRESS_MESSAGE = 1000


# Progress counts are stored as JSON numbers and shown as floats: bounded so that
# every reader can convert them (10**400 cannot be).
MAX_PROGRESS = 1e15


def progress_record(done: Any, total: Any, message: Any) -> dict[str, Any]:
    """The progress record, after checking the handler's values."""
    for name, value in (("done", done), ("total", total)):
        if value is None and name == "total":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"set_progress(): {name} must be a number >= 0, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not number >= 0:  # NaN too
            raise ValueError(f"set_progress(): {name} must be a number >= 0, got {value!r}")
        if number > MAX_PROGRESS:
            raise ValueError(
                f"set_progress(): {name} must be finite and at most {MAX_PROGRESS:g}, "
                f"got {value!r}"[:200]
            )
    if not isinstance(message, str):
        raise ValueError(f"set_progress(): message must be a string, got {message!r}")
    # No control characters: they would rewrite an operator's terminal (jobstatus).
    return {"done": done, "total": total, "message": printable(message, MAX_PROGRESS_MESSAGE)}


def run_ids(runs: Iterable[JobRun | int]) -> list[int]:
    return [run.pk if isinstance(run, JobRun) else int(run) for run in runs]


def wake_at(seconds: float) -> dict[str, datetime]:
    return {"until": timezone.now() + timedelta(seconds=seconds)}


def until_of(wake: dict[str, Any]) -> datetime:
    until = parse_datetime(wake["until"])
    assert until is not None
    return until


def event_outcome(name: str, output: Any, default: Any) -> Any:
    """What a wait for an event returns, from its record: the payload taken, or at
    its timeout ``default`` (``EventTimeout`` without one)."""
    if isinstance(output, dict) and output.get("timed_out"):
        if default is NO_DEFAULT:
            raise EventTimeout(f"no event {name!r} came before the wait's timeout", name)
        return default
    return output["payload"]


def blocking(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` as a plain function for a database thread (an atomic async step): an
    async ``fn``, or an awaitable it returns, is run to its end under
    ``async_to_sync``, whose ORM calls come back to that thread, in its transaction."""
    if inspect.iscoroutinefunction(fn):
        return async_to_sync(fn)

    def call() -> Any:
        value = fn()
        if inspect.isawaitable(value):
            awaitable = value

            async def wait() -> Any:
                return await awaitable

            return async_to_sync(wait)()
        return value

    return call
