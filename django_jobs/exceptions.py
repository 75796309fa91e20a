"""Exceptions raised by django_jobs: one base class, then the specific errors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from django.core.exceptions import SynchronousOnlyOperation

from .backoff import checked_delay

E = TypeVar("E", bound=BaseException)


class JobsError(Exception):
    """Base class of every error django_jobs raises on purpose."""


class UnknownJobType(JobsError, LookupError):
    """No handler is registered under this job type."""


class DuplicateJobType(JobsError):
    """Two different handlers were registered under one job type."""


class InvalidJobInput(JobsError, ValueError):
    """Input, output or an option of a run is not acceptable (not JSON, too large, ...)."""


class RunNotFound(JobsError, LookupError):
    """No run has this id (within the given tenant)."""


class InvalidSchedule(JobsError, ValueError):
    """A schedule cannot be added or changed as asked (a bad value, a taken name, a
    schedule declared in code); ``field`` names the bad argument, when one is."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ScheduleNotFound(JobsError, LookupError):
    """No schedule has this name."""


class InvalidTransition(JobsError):
    """The run is not in a state that allows the requested change."""


class InvalidStepOutput(JobsError, ValueError):
    """A step returned something that cannot be stored as JSON (never retried)."""


class JobCanceled(JobsError):
    """Raised inside a handler whose run was asked to cancel; the run ends canceled."""


class ChildRunError(JobsError):
    """A child run awaited with ``ctx.wait_for`` did not complete."""

    def __init__(self, message: str, run_id: int, error: object = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.error = error


class ChildRunFailed(ChildRunError):
    """An awaited child run failed."""


class ChildRunTimedOut(ChildRunError):
    """An awaited child run timed out."""


class ChildRunCanceled(ChildRunError):
    """An awaited child run was canceled."""


class EventTimeout(JobsError, TimeoutError):
    """``ctx.wait_for_event`` reached its timeout without an event and without a
    ``default``; the handler may catch it (a replay raises it again)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class RunError(JobsError):
    """The run a caller waited for (``JobRun.wait``) did not complete; ``error`` is
    the run's stored error (None for a cancel)."""

    def __init__(self, message: str, run_id: int, error: object = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.error = error


class RunFailed(RunError):
    """The run waited for failed."""


class RunTimedOut(RunError):
    """The run waited for timed out."""


class RunCanceled(RunError):
    """The run waited for was canceled."""


class WaitTimeout(JobsError, TimeoutError):
    """``JobRun.wait`` gave up after its timeout; the run itself is left as it is."""


class RetryAfter(JobsError):
    """Raise it in a handler to run the run again in ``delay``, not after its policy's backoff.

    For a service that says when to come back (an HTTP 429 or 503 with
    ``Retry-After``): ``raise RetryAfter(30)`` or ``RetryAfter(timedelta(minutes=5),
    "rate limited")``. The delay is used as given, without ``max_delay`` or jitter.
    It ends the attempt like any error: it spends the attempt, and on the run's
    last one (a job without a ``RetryPolicy`` has only one) the run fails with it
    recorded. ``delay`` is seconds or a ``timedelta`` from 0 to a week; anything
    else raises ``TypeError`` or ``ValueError`` here, where the handler raises it.
    """

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        self.seconds = checked_delay(delay, "RetryAfter's delay")
        self.reason = str(reason)
        text = f"retry in {self.seconds:g}s"
        super().__init__(f"{text}: {self.reason}" if self.reason else text)

    def __reduce__(self) -> tuple[Any, ...]:
        # Built again from its arguments, not from its message (pickling, copying).
        return (type(self), (self.seconds, self.reason), self.__dict__)


class JobTimeout(JobsError):
    """The run outlived its handler's ``timeout`` (stored as the run's error).

    Name it in ``RetryPolicy(non_retryable=[JobTimeout])`` to end timed-out runs
    at once instead of retrying them.
    """


class WorkerLost(JobsError):
    """The run's worker stopped heartbeating and the run had no attempts left.

    Stored as the error of runs that rescue ended ``failed``; never raised.
    """


class WorkerRefused(JobsError):
    """A worker cannot start on this database: another worker process holds it (SQLite)."""


class ExecutionError(JobsError):
    """django_jobs itself could not execute or record a run (stored, never raised)."""


class SyncOnlyCall(JobsError, SynchronousOnlyOperation):
    """A synchronous function (``start()``, ``start_many()``) was called from async code.

    A ``SynchronousOnlyOperation``, as Django's own refusal is; the message
    names ``sync_to_async``.
    """


def never_retried(error: E) -> E:
    """Mark ``error`` to fail its run whatever the retry policy says; return it.

    For an error whose type must stay what it is (a task's ``TypeError`` from
    ``normalize_json``, as Django's own backends record it) yet which running
    again cannot cure.
    """
    error.django_jobs_never_retried = True  # type: ignore[attr-defined]
    return error


def is_never_retried(error: BaseException) -> bool:
    return getattr(error, "django_jobs_never_retried", False) is True
