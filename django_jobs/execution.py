"""Run one claimed run and record its outcome with fenced updates."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from functools import partial
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.dispatch import Signal
from django.utils import timezone

from . import claims, conf, control, lifecycle, signals, tracing
from .claims import Claim
from .context import JobContext, LeaseLost, Suspended
from .exceptions import (
    InvalidJobInput,
    InvalidStepOutput,
    JobCanceled,
    JobTimeout,
    UnknownJobType,
    is_never_retried,
)
from .models import JobRun, Status
from .payloads import normalize
from .registry import JobHandler, get_handler

logger = logging.getLogger(__name__)


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"
    WAITING = "waiting"  # suspended on children or a durable sleep; already recorded
    LOST = "lost"  # the lease was gone when the outcome was written: nothing written
    QUEUED = "queued"  # a completion handed to the batch writer, which records and logs it


# The run status an outcome ends in, for outcomes that end the run.
ENDING = {
    Outcome.COMPLETED: Status.COMPLETED,
    Outcome.FAILED: Status.FAILED,
    Outcome.CANCELED: Status.CANCELED,
    Outcome.TIMED_OUT: Status.TIMED_OUT,
}

Write = Callable[[], Outcome]

# How long a stored error's message and traceback may be, in characters. An
# exception's text is as hostile as any payload (a 50 MB message would make a
# 100 MB run page); past these, the middle is cut and says how much.
MAX_ERROR_MESSAGE = 10_000
MAX_TRACEBACK = 50_000


@dataclass(frozen=True)
class Failure:
    """A write recording an error (a retry or an unsuccessful end), and that error.

    The error goes to the outcome's log line (with ``exc_info``, so that error
    trackers group runs by exception) and to ``run_failed`` / ``run_retry_scheduled``.
    """

    write: Write
    error: BaseException
    retry_in: float | None = None  # seconds until the next attempt, for a retry

    def __call__(self) -> Outcome:
        return self.write()


# Takes a completion over: (claim, output, duration) -> None once handed off, or
# whether the run was written when it had to be written at once.
HandOff = Callable[[Claim, Any, float], "bool | None"]


def error_record(error: BaseException, attempt: int, *, retryable: bool) -> dict[str, Any]:
    """Describe ``error`` for ``JobRun.error``: type, message, traceback, attempt.

    Never raises, and never returns text the database would refuse: an
    exception that cannot be printed is described as such.
    """
    cls = type(error)
    message = _safely(lambda: str(error), cls)
    trace = _safely(lambda: "".join(traceback.format_exception(error)), cls)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": _storable(clip(message, MAX_ERROR_MESSAGE)),
        # A traceback's end names the failing line: keep both ends of a long one.
        "traceback": _storable(clip(trace, MAX_TRACEBACK, tail=MAX_TRACEBACK * 4 // 5)),
        "attempt": attempt,
        "retryable": retryable,
    }


def clip(text: str, limit: int, *, tail: int = 0) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out;
    the last ``tail`` of them are kept from its end."""
    if len(text) <= limit:
        return text
    head = limit - tail
    dropped = len(text) - head - tail
    return f"{text[:head]}\n… [{dropped:,} characters cut] …\n{text[len(text) - tail :]}"


def _safely(render: Callable[[], str], cls: type) -> str:
    try:
        return render()
    except Exception:
        return f"<unprintable {cls.__name__}>"


def _storable(text: str) -> str:
    """Text a jsonb column accepts: no NUL characters, no lone surrogates."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def execute(
    claim: Claim,
    *,
    ctx: JobContext | None = None,
    stop: threading.Event | None = None,
    complete: Callable[[Claim, Any], bool] | None = None,
    hand_off: HandOff | None = None,
) -> Outcome:
    """Run the handler of ``claim`` and record what happened. Never raises for the run.

    ``stop`` is the worker's hard-stop event: outcome writes that fail on a dropped
    connection are retried until they land or it is set. ``complete`` writes a
    completion (a worker passes its batching ``Completer.complete``); ``hand_off``,
    when given, takes over the completion of a run without a parent while nobody
    listens to ``run_completed`` (``Completer.hand_off``): the outcome is then
    ``QUEUED``, and the completer records and logs it.
    """
    started = time.monotonic()
    write: Write | None = None
    try:
        write = _prepare(claim, ctx, complete or claims.complete, hand_off)
        outcome = settle(claim, write, stop)
    except Exception as exc:
        # A bug of ours, not the handler's: still end the run, never leave it running.
        logger.exception("run=%s could not be executed", claim.run_id)
        outcome = settle(claim, Failure(_last_resort(claim, exc), exc), stop)
    if outcome is not Outcome.QUEUED:
        # A run the watchdog ended (timeout, ignored cancel) was counted then;
        # the handler's late return is logged (its result dropped), not counted again.
        late = outcome is Outcome.LOST and ctx is not None and ctx.fenced_off
        log_outcome(claim, outcome, time.monotonic() - started, observe=not late, write=write)
        if outcome is not Outcome.COMPLETED:
            # The handler may have failed on a broken connection (to any
            # database): close it, so the next run on this thread gets a fresh one.
            discard_broken_connections()
    return outcome


def _prepare(
    claim: Claim,
    ctx: JobContext | None,
    complete: Callable[[Claim, Any], bool],
    hand_off: HandOff | None,
) -> Write:
    """Run the handler (when there is one to run) and return the write of its outcome."""
    try:
        handler = get_handler(claim.row["job_type"], resolve=True)
    except UnknownJobType as exc:
        # start() refuses unknown types, so this is a deploy where this worker
        # lacks a handler the enqueuer had. Fail it visibly; it can be retried.
        return _not_retryable(claim, exc)
    if claim.row["cancel_requested_at"] is not None:
        # Asked to cancel while it was between attempts: do not start it again.
        return cancel_write(claim, "canceled before the attempt started")
    ctx = ctx or JobContext(claim, timeout=handler.timeout)
    return _run_handler(handler, ctx, complete, hand_off)


def _last_resort_error(claim: Claim, exc: Exception) -> dict[str, Any]:
    return {
        "type": "django_jobs.exceptions.ExecutionError",
        "message": _storable(_safely(lambda: repr(exc), Exception)),
        "traceback": "",
        "attempt": claim.attempt,
        "retryable": False,
    }


def _last_resort(claim: Claim, exc: Exception) -> Write:
    """A fenced fail with a minimal error record, and what a run's end implies
    (its children's close policies, its waiting parent woken)."""
    return fail_write(claim, _last_resort_error(claim, exc))


def _bare_fail(claim: Claim, exc: Exception) -> Write:
    """When even ``_last_resort`` was refused: end the run on its own, then apply
    what its end implies in a transaction of its own, on a best-effort basis.

    Applying it later is still right: a parent is woken only if all it awaits
    has ended, and a parent that suspends afterwards looks for itself.
    """

    def write() -> Outcome:
        if not claims.fail(claim, _last_resort_error(claim, exc)):
            return Outcome.LOST
        parent_id = claim.row.get("parent_id")
        try:
            with transaction.atomic(using=conf.get().DATABASE):
                lifecycle.lock_parent(parent_id)
                lifecycle.after_end(claim.run_id, parent_id, Status.FAILED)
        except DatabaseError:
            logger.exception(
                "run=%s failed, but its parent and children could not be told", claim.run_id
            )
        return Outcome.FAILED

    return write


def _run_handler(
    handler: JobHandler,
    ctx: JobContext,
    complete: Callable[[Claim, Any], bool],
    hand_off: HandOff | None,
) -> Write:
    """Call the handler and return the write that records its result (not yet done)."""
    claim = ctx.claim
    signals.run_started.send_robust(
        JobRun, run_id=claim.run_id, job_type=handler.job_type, attempt=claim.attempt
    )
    ctx.atomic_depth = len(jobs_connection().atomic_blocks)
    try:
        with tracing.run_span(claim, suspended=(Suspended, LeaseLost)):
            result = _call(handler, ctx)
    except Suspended:
        return lambda: Outcome.WAITING
    except LeaseLost:
        return lambda: Outcome.LOST
    except BaseException as exc:  # a handler's SystemExit ends its run, not the worker
        if not ctx.own_outcome():
            # The worker ended the run over the handler's head (its timeout, an
            # ignored cancel) and records that: the JobCanceled it raised in the
            # handler is not a cancel of its own.
            return lambda: Outcome.LOST
        if ctx.past_deadline():
            return timeout_write(handler, claim)
        if isinstance(exc, JobCanceled):
            return cancel_write(claim, str(exc) or "the handler raised JobCanceled")
        if not retryable(handler, exc):
            return _not_retryable(claim, exc)
        return error_write(handler, claim, exc)
    if not ctx.own_outcome():
        return lambda: Outcome.LOST
    if ctx.past_deadline():
        return timeout_write(handler, claim)
    try:
        output = normalize(result, what=f"the output of {handler.job_type} run {claim.run_id}")
    except InvalidJobInput as exc:
        # Running the same code again would return the same value: not retryable.
        return _not_retryable(claim, exc)
    if claim.row["parent_id"] is not None:
        # Its parent may wait for it: the wake-up needs the single-run path.
        complete = claims.complete
    elif hand_off is not None and handler.on_end is None and not _listened(signals.run_completed):
        return partial(_hand_off, hand_off, claim, output, time.monotonic() - ctx.started)
    return partial(_write, complete, claim, output, Outcome.COMPLETED)


def _call(handler: JobHandler, ctx: JobContext) -> Any:
    """Call the handler, then write the progress its throttle held back.

    The progress is a report, not the outcome: failing to write it (the run
    was lost, the connection broke) is logged and leaves the outcome to the write
    that follows.
    """
    try:
        return handler(ctx)
    finally:
        try:
            ctx.flush_progress()
        except (LeaseLost, DatabaseError) as exc:
            logger.warning("run=%s last progress not written: %s", ctx.run_id, exc)


def _listened(signal: Signal) -> bool:
    """Whether a receiver is connected for runs (the common "none" answered cheaply)."""
    return bool(signal.receivers) and signal.has_listeners(JobRun)


def _hand_off(hand_off: HandOff, claim: Claim, output: Any, duration: float) -> Outcome:
    written = hand_off(claim, output, duration)
    if written is None:
        return Outcome.QUEUED
    return Outcome.COMPLETED if written else Outcome.LOST


def retryable(handler: JobHandler, exc: BaseException) -> bool:
    """Whether another attempt might cure ``exc``: what a run's error and a
    failed step's error both record as ``retryable``.

    Whether attempts are left is another matter: a retryable error on the last
    attempt still fails the run.
    """
    if isinstance(exc, (JobCanceled, InvalidStepOutput)) or is_never_retried(exc):
        return False
    return handler.retry.is_retryable(exc)


def error_write(handler: JobHandler, claim: Claim, exc: BaseException) -> Write:
    """The write for a handler that raised: a retry with backoff, or failed."""
    policy = handler.retry
    if _goes_again(handler, claim, exc):
        error = error_record(exc, claim.attempt, retryable=True)
        delay = policy.delay(claim.attempt)
        retry = partial(_write, claims.reschedule, claim, error, Outcome.RETRY, delay)
        return Failure(retry, exc, retry_in=delay)
    error = error_record(exc, claim.attempt, retryable=retryable(handler, exc))
    return Failure(fail_write(claim, error), exc)


def _goes_again(handler: JobHandler, claim: Claim, exc: BaseException) -> bool:
    """Whether the run gets another attempt: attempts left and a retryable error.

    The attempts are the run's own ``max_attempts``, stored at enqueue (as rescue
    reads them), so a deploy that changes a policy does not change what queued
    runs were promised; the policy still says which errors are retryable.
    """
    return claim.attempt < int(claim.row["max_attempts"]) and handler.retry.is_retryable(exc)


def timeout_write(handler: JobHandler, claim: Claim) -> Write:
    """The write for a run past its timeout: a retry per its policy, or timed out."""
    exc = JobTimeout(f"run {claim.run_id} exceeded its timeout of {handler.timeout:g}s")
    if _goes_again(handler, claim, exc):
        return error_write(handler, claim, exc)
    error = error_record(exc, claim.attempt, retryable=False)
    return Failure(_end_write(claim, Outcome.TIMED_OUT, error, cancel_requested_at=Now()), exc)


def _not_retryable(claim: Claim, exc: BaseException) -> Failure:
    """The write that fails the run at once for ``exc``."""
    return Failure(fail_write(claim, error_record(exc, claim.attempt, retryable=False)), exc)


def fail_write(claim: Claim, error: dict[str, Any]) -> Write:
    return _end_write(claim, Outcome.FAILED, error)


def cancel_write(claim: Claim, message: str) -> Write:
    """The write that ends the run canceled; the reason given to ``cancel()`` is kept."""
    error = error_record(JobCanceled(message), claim.attempt, retryable=False)
    error["traceback"] = ""
    return _end_write(claim, Outcome.CANCELED, error)


def _end_write(claim: Claim, outcome: Outcome, error: Any, **extra: Any) -> Write:
    """The write that ends the run with ``outcome``'s status (fenced, with follow-ups)."""

    def end(c: Claim, e: Any) -> bool:
        return claims.end(c, ENDING[outcome], e, **extra)

    return partial(_write, end, claim, error, outcome)


def _write(
    fenced: Callable[..., bool], claim: Claim, value: Any, outcome: Outcome, *args: Any
) -> Outcome:
    """Perform one fenced write, and what a run's end implies, in one transaction.

    A lost lease turns the outcome into LOST. A run that ends without a parent
    to wake and without an unsuccessful status needs no follow-up, so it stays
    one autocommitted statement (the hot path).
    """
    status = ENDING.get(outcome)
    parent_id = claim.row["parent_id"]
    if status is None or (parent_id is None and status == Status.COMPLETED):
        return outcome if fenced(claim, value, *args) else Outcome.LOST
    with transaction.atomic(using=conf.get().DATABASE):
        lifecycle.lock_parent(parent_id)
        if not fenced(claim, value, *args):
            return Outcome.LOST
        lifecycle.after_end(claim.run_id, parent_id, status)
    return outcome


def settle(claim: Claim, write: Write, stop: threading.Event | None) -> Outcome:
    """Perform an outcome write, riding out a dropped database connection.

    A write that fails because the connection broke is retried on a fresh one,
    with a capped backoff, until it lands or the worker is told to stop hard (then
    the run stays ``running`` under this lease and is released or rescued).
    Any other database error is recorded as the run's failure instead.
    """
    delay = 0.2
    rejected = 0
    retrying = False
    while True:
        if retrying or jobs_connection().errors_occurred:
            discard_broken_connections()
        retrying = True
        try:
            outcome = write()
        except (OperationalError, InterfaceError) as exc:
            logger.warning(
                "run=%s outcome not written, database unavailable (%s); retrying in %.1fs",
                claim.run_id,
                type(exc).__name__,
                delay,
            )
        except DatabaseError as exc:
            logger.error("run=%s outcome rejected by the database: %s", claim.run_id, exc)
            # First a failure naming the database's error; if even that is
            # refused, one with a minimal record; then the end on its own and its
            # follow-up apart; then give up (the run is rescued once this worker
            # stops). Each ends the run the way any failure does.
            rejected += 1
            if rejected == 1:
                write = _not_retryable(claim, exc)
            elif rejected == 2:
                write = Failure(_last_resort(claim, exc), exc)
            elif rejected == 3:
                write = Failure(_bare_fail(claim, exc), exc)
            else:
                return Outcome.LOST
            continue
        else:
            _signal(claim, outcome, write)
            return outcome
        with control.released():  # a worker's other control threads go on meanwhile
            if stop is not None and stop.wait(delay):
                return Outcome.LOST
            if stop is None:
                time.sleep(delay)
        delay = min(delay * 2, 5.0)


SIGNALS = {
    Outcome.COMPLETED: signals.run_completed,
    Outcome.FAILED: signals.run_failed,
    Outcome.RETRY: signals.run_retry_scheduled,
    Outcome.CANCELED: signals.run_canceled,
    Outcome.TIMED_OUT: signals.run_timed_out,
}


# The signals that carry the error (``exception``), as Celery's task_failure does.
WITH_EXCEPTION = frozenset({Outcome.FAILED, Outcome.RETRY})


def _signal(claim: Claim, outcome: Outcome, write: Write) -> None:
    signal = SIGNALS.get(outcome)
    if signal is None:
        return
    extra = {}
    if outcome in WITH_EXCEPTION:
        extra["exception"] = write.error if isinstance(write, Failure) else None
    lifecycle.announce(
        signal, claim.run_id, claim.row["job_type"], claim.attempt, ended=outcome in ENDING, **extra
    )


_thread = threading.local()


def jobs_connection() -> BaseDatabaseWrapper:
    """This thread's connection to the jobs database.

    Looked up once per thread (Django keeps one connection object per thread
    and alias; ``connections[alias]`` costs several microseconds a run).
    """
    alias = conf.get().DATABASE
    if getattr(_thread, "alias", None) != alias:
        _thread.connection, _thread.alias = connections[alias], alias
    connection: BaseDatabaseWrapper = _thread.connection
    return connection


def discard_broken_connections() -> None:
    """Close this thread's connections that errored and no longer answer.

    Connections are otherwise kept open across runs: reconnecting per run costs
    more than the run itself for short jobs.
    """
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred:
            if connection.in_atomic_block or not connection.is_usable():
                connection.close()
            connection.errors_occurred = False


# Told of every outcome this process records, after it is written:
# (claim, outcome, seconds the attempt took). The metrics module adds one.
Observer = Callable[[Claim, Outcome, float], None]
outcome_observers: list[Observer] = []


# A retry is a WARNING, an unsuccessful end an ERROR; every other outcome is INFO.
LEVELS = {
    Outcome.RETRY: logging.WARNING,
    Outcome.FAILED: logging.ERROR,
    Outcome.TIMED_OUT: logging.ERROR,
}


def log_outcome(
    claim: Claim,
    outcome: Outcome,
    duration: float,
    *,
    observe: bool = True,
    write: Write | None = None,
) -> None:
    """The one line per run outcome (no payloads); then the observers, if ``observe``.

    A retry or an unsuccessful end whose write carries the error (a ``Failure``)
    names the error's type and message, the next attempt's time for a retry,
    and passes ``exc_info``, so that error trackers see the handler's exception.
    """
    args: tuple[Any, ...] = (
        claim.run_id,
        claim.row["job_type"],
        outcome.value,
        claim.attempt,
        duration,
    )
    level = LEVELS.get(outcome, logging.INFO)
    if level == logging.INFO or not isinstance(write, Failure):
        logger.log(level, "run=%s type=%s outcome=%s attempt=%d duration=%.3fs", *args)
    else:
        error = write.error
        cls = type(error)
        message = _safely(lambda: str(error), cls)
        if outcome is Outcome.RETRY and write.retry_in is not None:
            when = timezone.now() + timedelta(seconds=write.retry_in)
            next_attempt = when.isoformat(timespec="seconds")
        else:
            next_attempt = "none"
        logger.log(
            level,
            "run=%s type=%s outcome=%s attempt=%d duration=%.3fs error=%s message=%r "
            "next_attempt=%s",
            *args,
            f"{cls.__module__}.{cls.__qualname__}",
            message,
            next_attempt,
            exc_info=error,
        )
    for observer in outcome_observers if observe else ():
        try:
            observer(claim, outcome, duration)
        except Exception:
            logger.exception("run=%s outcome observer %r failed", claim.run_id, observer)
