"""Run one attempt of a claimed run, decide what it came to, and record that.

Three steps, each with one home:

* ``decide`` runs the handler and returns a ``Decision`` (completed with an
  output, a retry, failed, canceled, timed out; or waiting and lost, which are
  already settled);
* ``record`` writes a decision through ``transitions`` (or the worker's
  ``Completer``), riding out a dropped connection, then sends its signal;
* ``log_outcome`` writes the one log line per outcome and tells the observers.

``execute`` does the three for a worker's slot and for ``testing.drain``. A
completion handed to the completer (``Outcome.HANDED_OFF``) is written and
logged by the completer, through ``record_handed_off``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.models.functions import Now
from django.dispatch import Signal
from django.utils import timezone

from . import signals, tracing, transitions
from .attempt import Attempt
from .context import JobContext, LeaseLost, Suspended
from .errors import MAX_ERROR_MESSAGE, clip, error_record, message_of, safely, storable, type_name
from .exceptions import InvalidJobInput, JobCanceled, JobTimeout, RetryAfter, UnknownJobType
from .logstream import SafeTracebacks, outcome_line_follows
from .models import JobRun, Status
from .payloads import normalize
from .registry import JobHandler, get_handler
from .results import current_run
from .storage import control
from .storage.claiming import Claim
from .storage.connections import (
    discard_broken_connections,
    end_leaked_transaction,
    jobs_connection,
)

if TYPE_CHECKING:
    from .completer import Completer

logger = logging.getLogger(__name__)
# This logger's records carry handlers' exceptions: whatever formats them, their
# tracebacks add no line to a log and are bounded as stored errors are.
logger.addFilter(SafeTracebacks())


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"
    WAITING = "waiting"  # suspended on children or a durable sleep; already recorded
    LOST = "lost"  # the lease was gone when the outcome was written: nothing written
    # A completion handed to the worker's completer, which writes and logs it.
    HANDED_OFF = "handed_off"


# The status a run finishes in, for the outcomes that finish it.
FINISHED_AS = {
    Outcome.COMPLETED: Status.COMPLETED,
    Outcome.FAILED: Status.FAILED,
    Outcome.CANCELED: Status.CANCELED,
    Outcome.TIMED_OUT: Status.TIMED_OUT,
}


@dataclass(slots=True)
class Decision:
    """What an attempt came to, before it is written: the one input of ``record``.

    Not changed once made (not frozen only because that costs each run more).
    """

    outcome: Outcome
    output: Any = None  # of a completed run
    error: dict[str, Any] | None = None  # the stored error of a retry or an unsuccessful end
    # The handler's exception, for the log line (``exc_info``, so that error
    # trackers group runs by exception) and the signals that carry it.
    exception: BaseException | None = None
    retry_in: float | None = None  # seconds until the next attempt, for a retry
    # A completion nobody waits on (no parent, no on_end, no run_completed
    # receiver) may be handed to the worker's completer.
    may_hand_off: bool = False
    # The last resort: the end written alone, what it implies in a transaction apart.
    follow_ups_apart: bool = False


def execute(
    claim: Claim,
    *,
    attempt: Attempt | None = None,
    stop: threading.Event | None = None,
    completer: Completer | None = None,
) -> Outcome:
    """Run the handler of ``claim``, record what happened, and log it. Never raises for the run.

    ``attempt`` is the worker's (with its handler looked up at dispatch); ``stop``
    is the worker's hard-stop event: writes that fail on a dropped connection
    are retried until they land or it is set. With a ``completer``, completions
    of runs without a parent are written in its batches.
    """
    started = time.monotonic()
    decision: Decision | None = None
    try:
        attempt = attempt or Attempt.of(claim)
        connection = jobs_connection()
        outside = not connection.in_atomic_block
        decision = decide(attempt)
        if outside and connection.in_atomic_block:
            # The handler entered a block it never left: its writes were never
            # committed, and the outcome's (and every later run's on this thread)
            # would wait inside it. Undo it, with a WARNING, and write on a fresh one.
            end_leaked_transaction(connection)
        outcome = record(claim, decision, stop, completer, attempt=attempt)
    except Exception as exc:
        # A bug of ours, not the handler's: still finish the run, never leave it running.
        logger.exception("run=%s could not be executed", claim.run_id)
        outcome = record(claim, last_resort(claim, exc), stop)
    if outcome is not Outcome.HANDED_OFF:
        # A run the watchdog finished (timeout, ignored cancel) was logged and
        # counted then; the handler's late return (its result dropped) is a DEBUG line.
        late = outcome is Outcome.LOST and attempt is not None and attempt.fenced_off
        log_outcome(claim, outcome, time.monotonic() - started, decision, late=late)
        if outcome is not Outcome.COMPLETED:
            # The handler may have failed on a broken connection (to any
            # database): close it, so the next run on this thread gets a fresh one.
            discard_broken_connections()
    return outcome


# --- deciding --------------------------------------------------------------------------


def decide(attempt: Attempt) -> Decision:
    """Run the attempt's handler (when there is one to run) and decide what it came to."""
    claim = attempt.claim
    if claim.unreadable is not None:
        return _unreadable(claim)
    handler = attempt.handler
    if handler is None:
        try:
            handler = attempt.handler = get_handler(claim.job_type, resolve=True)
        except UnknownJobType as exc:
            # start() refuses unknown types, so this is a deploy where this worker
            # lacks a handler the enqueuer had. Fail it visibly; it can be retried.
            return _not_retryable(claim, exc)
    if claim.cancel_requested_at is not None:
        # Asked to cancel while it was between attempts: do not start it again.
        return canceled(claim, "canceled before the attempt started")
    return _run_handler(handler, attempt)


def _run_handler(handler: JobHandler, attempt: Attempt) -> Decision:
    ctx = _begin(handler, attempt)
    try:
        with _span(attempt):
            result = _call(handler, ctx, attempt)
    except BaseException as exc:  # a handler's SystemExit finishes its run, not the worker
        return _raised(handler, attempt, exc)
    return _returned(handler, attempt, result)


def _begin(handler: JobHandler, attempt: Attempt) -> JobContext:
    """Announce the attempt and make the handler's context (on a thread with a connection)."""
    claim = attempt.claim
    signals.run_started.send_robust(
        JobRun, run_id=claim.run_id, job_type=handler.job_type, attempt=claim.attempt
    )
    attempt.atomic_depth = len(jobs_connection().atomic_blocks)
    return JobContext(attempt)


def _span(attempt: Attempt) -> AbstractContextManager[None]:
    claim = attempt.claim
    return tracing.run_span(
        claim.run_id,
        claim.job_type,
        claim.pool,
        claim.attempt,
        (Suspended, LeaseLost),
        claim.trace_context,
    )


def _raised(handler: JobHandler, attempt: Attempt, exc: BaseException) -> Decision:
    """What an attempt whose handler raised ``exc`` came to."""
    claim = attempt.claim
    if isinstance(exc, Suspended):
        return Decision(Outcome.WAITING)
    if isinstance(exc, LeaseLost):
        return Decision(Outcome.LOST)
    if not attempt.own_outcome():
        # The worker finished the run over the handler's head (its timeout, an
        # ignored cancel) and records that: the JobCanceled it raised in the
        # handler is not a cancel of its own.
        return Decision(Outcome.LOST)
    if attempt.past_deadline():
        return timed_out(handler, claim)
    if isinstance(exc, JobCanceled):
        return canceled(claim, str(exc) or "the handler raised JobCanceled")
    if not handler.retryable(exc):
        return _not_retryable(claim, exc)
    return failed_attempt(handler, claim, exc)


def _returned(handler: JobHandler, attempt: Attempt, result: Any) -> Decision:
    """What an attempt whose handler returned ``result`` came to."""
    claim = attempt.claim
    if not attempt.own_outcome():
        return Decision(Outcome.LOST)
    if attempt.past_deadline():
        return timed_out(handler, claim)
    try:
        output = normalize(result, what=f"the output of {handler.job_type} run {claim.run_id}")
    except InvalidJobInput as exc:
        # Running the same code again would return the same value: not retryable.
        return _not_retryable(claim, exc)
    quiet = handler.on_end is None and not _listened(signals.run_completed)
    return Decision(Outcome.COMPLETED, output=output, may_hand_off=quiet)


def _call(handler: JobHandler, ctx: JobContext, attempt: Attempt) -> Any:
    """Call the handler, then write the progress its throttle held back.

    The progress is a report, not the outcome: failing to write it (the run
    was lost, the connection broke) is logged and leaves the outcome to the write
    that follows. An ``async def`` handler met here (``drain()``, a worker without
    async slots) runs to its end under ``async_to_sync``, its database work on this thread.
    """
    if handler.is_async:
        return async_to_sync(_acall)(handler, ctx, attempt)
    token = current_run.set(ctx.run_id)
    try:
        return handler(ctx)
    finally:
        current_run.reset(token)
        try:
            ctx.flush_progress()
        except (LeaseLost, DatabaseError) as exc:
            logger.warning("run=%s last progress not written: %s", ctx.run_id, exc)


async def _acall(handler: JobHandler, ctx: JobContext, attempt: Attempt) -> Any:
    """Await an async handler in a task the worker can cancel, then write the
    progress its throttle held back."""
    attempt.bind_task()
    token = current_run.set(ctx.run_id)
    try:
        return await handler.fn(ctx)
    finally:
        # async_to_sync (drain(), a worker's thread) copies the context back out.
        current_run.reset(token)
        try:
            await ctx.aflush_progress()
        except (LeaseLost, DatabaseError) as exc:
            logger.warning("run=%s last progress not written: %s", ctx.run_id, exc)


# --- async handlers on the worker's event loop -----------------------------------------


async def execute_async(
    attempt: Attempt, *, stop: threading.Event, completer: Completer | None = None
) -> Outcome:
    """``execute`` for an async handler on the worker's event loop: the handler is
    awaited there, its database work runs through ``attempt.run_sync``.

    Raises ``asyncio.CancelledError`` when the worker stopped the task after it
    took the outcome over (it records that) or gave the run back.
    """
    claim = attempt.claim
    started = time.monotonic()
    decision: Decision | None = None
    try:
        decision = await _decide_async(attempt)
        if (
            decision.may_hand_off
            and claim.parent_id is None
            and completer is not None
            and completer.try_hand_off(claim, decision.output, time.monotonic() - started)
        ):
            return Outcome.HANDED_OFF
        outcome: Outcome = await attempt.run_sync(record, claim, decision, stop, completer)
    except Exception as exc:
        logger.exception("run=%s could not be executed", claim.run_id)
        outcome = await attempt.run_sync(record, claim, last_resort(claim, exc), stop)
    late = outcome is Outcome.LOST and attempt.fenced_off
    log_outcome(claim, outcome, time.monotonic() - started, decision, late=late)
    if outcome is not Outcome.COMPLETED:
        # The handler's ORM calls ran on Django's sync thread: the connection there
        # may be the one that broke (the database threads mend their own).
        await sync_to_async(discard_broken_connections, thread_sensitive=True)()
    return outcome


async def _decide_async(attempt: Attempt) -> Decision:
    claim = attempt.claim
    if claim.unreadable is not None:
        return _unreadable(claim)
    handler = attempt.handler
    assert handler is not None
    assert handler.is_async
    if claim.cancel_requested_at is not None:
        return canceled(claim, "canceled before the attempt started")
    if _listened(signals.run_started):
        ctx = await attempt.run_sync(_begin, handler, attempt)
    else:
        ctx = JobContext(attempt)
    try:
        with _span(attempt):
            result = await _acall(handler, ctx, attempt)
    except asyncio.CancelledError as exc:
        if attempt.task_stopped:
            raise  # the worker's: it recorded the outcome, or gave the run back
        return _raised(handler, attempt, exc)  # the handler's own, as any exception
    except BaseException as exc:
        return _raised(handler, attempt, exc)
    return _returned(handler, attempt, result)


def _listened(signal: Signal) -> bool:
    """Whether a receiver is connected for runs (the common "none" answered cheaply)."""
    return bool(signal.receivers) and signal.has_listeners(JobRun)


def failed_attempt(handler: JobHandler, claim: Claim, exc: BaseException) -> Decision:
    """The decision for a handler that raised: a retry with backoff (or when the
    handler's ``RetryAfter`` says), or failed."""
    if _goes_again(handler, claim, exc):
        # A RetryAfter's delay was checked where the handler raised it.
        delay = exc.seconds if isinstance(exc, RetryAfter) else handler.retry.delay(claim.attempt)
        error = error_record(exc, claim.attempt, retryable=True)
        return Decision(Outcome.RETRY, error=error, exception=exc, retry_in=delay)
    error = error_record(exc, claim.attempt, retryable=handler.retryable(exc))
    if isinstance(exc, RetryAfter):
        error["message"] += (
            f" (on the last attempt, {claim.attempt} of {claim.max_attempts}: RetryAfter "
            "spends an attempt like any error; RetryPolicy(attempts=N) allows more)"
        )
    return Decision(Outcome.FAILED, error=error, exception=exc)


def _goes_again(handler: JobHandler, claim: Claim, exc: BaseException) -> bool:
    """Whether the run gets another attempt: attempts left and a retryable error.

    The attempts are the run's own ``max_attempts``, stored at enqueue (as rescue
    reads them), so a deploy that changes a policy does not change what queued
    runs were promised; the policy still says which errors are retryable.
    """
    return claim.attempt < claim.max_attempts and handler.retryable(exc)


def timed_out(handler: JobHandler, claim: Claim) -> Decision:
    """The decision for a run past its timeout: a retry per its policy, or timed out."""
    exc = JobTimeout(f"run {claim.run_id} exceeded its timeout of {handler.timeout:g}s")
    if _goes_again(handler, claim, exc):
        return failed_attempt(handler, claim, exc)
    error = error_record(exc, claim.attempt, retryable=False)
    return Decision(Outcome.TIMED_OUT, error=error, exception=exc)


def canceled(claim: Claim, message: str) -> Decision:
    """The decision that finishes the run canceled; the reason given to ``cancel()`` is kept."""
    error = error_record(JobCanceled(message), claim.attempt, retryable=False)
    error["traceback"] = ""
    return Decision(Outcome.CANCELED, error=error)


def _unreadable(claim: Claim) -> Decision:
    """A run whose row the claim could not read (``Claim.unreadable`` says why): its
    handler is not called on what is left of it, and another attempt would read
    the same row, so it fails at once."""
    return _not_retryable(
        claim, InvalidJobInput(f"the run's row cannot be read: {claim.unreadable}")
    )


def _not_retryable(claim: Claim, exc: BaseException) -> Decision:
    """The decision that fails the run at once for ``exc``."""
    error = error_record(exc, claim.attempt, retryable=False)
    return Decision(Outcome.FAILED, error=error, exception=exc)


def last_resort(claim: Claim, exc: Exception) -> Decision:
    """A failure with a minimal error record, for when the full one cannot be written."""
    error = {
        "type": "django_jobs.exceptions.ExecutionError",
        "message": storable(safely(lambda: repr(exc), Exception)),
        "traceback": "",
        "attempt": claim.attempt,
        "retryable": False,
    }
    return Decision(Outcome.FAILED, error=error, exception=exc)


# --- recording -------------------------------------------------------------------------


def record(
    claim: Claim,
    decision: Decision,
    stop: threading.Event | None = None,
    completer: Completer | None = None,
    *,
    attempt: Attempt | None = None,
) -> Outcome:
    """Write ``decision`` for ``claim``, riding out a dropped database connection, then
    send its signal; return the outcome written (``LOST`` when the lease was gone).

    A write that fails because the connection broke is retried on a fresh one,
    with a capped backoff, until it lands or ``stop`` is set (then the run stays
    ``running`` under this lease and is released or rescued). A write the
    database refuses is replaced by a failure naming the refusal; if even that is
    refused, by one with a minimal record; then by the end written alone and its
    follow-ups apart; then given up (the run is rescued once this worker stops).
    ``attempt`` gives a handed-off completion the handler's duration, for its log line.
    """
    delay = 0.2
    rejected = 0
    retrying = False
    while True:
        if retrying or jobs_connection().errors_occurred:
            discard_broken_connections()
        retrying = True
        try:
            outcome = _write(claim, decision, completer, attempt)
        except (OperationalError, InterfaceError) as exc:
            # The database's own words: a deadlock or a lock wait timeout reads
            # differently from a lost connection, and needs another fix.
            logger.warning(
                "run=%s outcome not written (%s: %s); retrying in %.1fs",
                claim.run_id,
                type(exc).__name__,
                str(exc)[:300],
                delay,
            )
        except DatabaseError as exc:
            logger.error("run=%s outcome rejected by the database: %s", claim.run_id, exc)
            rejected += 1
            if rejected == 1:
                decision = _not_retryable(claim, exc)
            elif rejected == 2:
                decision = last_resort(claim, exc)
            elif rejected == 3:
                decision = replace(last_resort(claim, exc), follow_ups_apart=True)
            else:
                return Outcome.LOST
            continue
        else:
            # Its callers log the outcome (log_outcome): a receiver's line telling the
            # same end (Django's tasks framework's) can tell it is a duplicate.
            with outcome_line_follows(claim.run_id):
                _announce(claim, outcome, decision)
            return outcome
        with control.released():  # a worker's other control threads go on meanwhile
            if stop is not None and stop.wait(delay):
                return Outcome.LOST
            if stop is None:
                time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _write(
    claim: Claim, decision: Decision, completer: Completer | None, attempt: Attempt | None
) -> Outcome:
    outcome = decision.outcome
    if outcome is Outcome.WAITING or outcome is Outcome.LOST:
        return outcome  # settled already: nothing to write
    if outcome is Outcome.RETRY:
        assert decision.error is not None
        assert decision.retry_in is not None
        written = transitions.retry_later(claim, decision.error, decision.retry_in)
        return outcome if written else Outcome.LOST
    if outcome is Outcome.COMPLETED and claim.parent_id is None and completer is not None:
        if decision.may_hand_off:
            took = time.monotonic() - attempt.started if attempt is not None else 0.0
            handed = completer.hand_off(claim, decision.output, took)
            if handed is None:
                return Outcome.HANDED_OFF
            return outcome if handed else Outcome.LOST
        return outcome if completer.complete(claim, decision.output) else Outcome.LOST
    extra = {"cancel_requested_at": Now()} if outcome is Outcome.TIMED_OUT else {}
    written = transitions.finish(
        claim,
        FINISHED_AS[outcome],
        output=decision.output,
        error=decision.error,
        follow_ups_apart=decision.follow_ups_apart,
        **extra,
    )
    return outcome if written else Outcome.LOST


def record_handed_off(
    claim: Claim, written: bool | BaseException, duration: float, stop: threading.Event
) -> None:
    """The completer's report on a handed-off completion: log it, or, when the
    database refused that run's write (``written`` is the error), fail the run."""
    if isinstance(written, BaseException):
        error = error_record(written, claim.attempt, retryable=False)
        outcome = record(claim, Decision(Outcome.FAILED, error=error), stop)
    else:
        outcome = Outcome.COMPLETED if written else Outcome.LOST
    log_outcome(claim, outcome, duration)


SIGNALS = {
    Outcome.COMPLETED: signals.run_completed,
    Outcome.FAILED: signals.run_failed,
    Outcome.RETRY: signals.run_retry_scheduled,
    Outcome.CANCELED: signals.run_canceled,
    Outcome.TIMED_OUT: signals.run_timed_out,
}

# The signals that carry the error (``exception``), as Celery's task_failure does.
WITH_EXCEPTION = frozenset({Outcome.FAILED, Outcome.RETRY})


def _announce(claim: Claim, outcome: Outcome, decision: Decision) -> None:
    signal = SIGNALS.get(outcome)
    if signal is None:
        return
    extra = {"exception": decision.exception} if outcome in WITH_EXCEPTION else {}
    transitions.announce(
        transitions.Announcement(
            signal,
            claim.run_id,
            claim.job_type,
            claim.attempt,
            finished=outcome in FINISHED_AS,
            extra=extra,
        )
    )


# --- logging ---------------------------------------------------------------------------

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
    decision: Decision | None = None,
    *,
    late: bool = False,
) -> None:
    """The one line per run outcome (no payloads); then the observers.

    A retry or an unsuccessful end decided for a handler's exception names the
    exception's type and message, the next attempt's time for a retry, and
    passes ``exc_info``, so that error trackers see the handler's exception.
    ``late``: the handler returned after the watchdog ended its run (a timeout,
    an ignored cancel), whose line that was; this one is DEBUG, and not observed.
    """
    args: tuple[Any, ...] = (claim.run_id, claim.job_type, outcome.value, claim.attempt, duration)
    level = logging.DEBUG if late else LEVELS.get(outcome, logging.INFO)
    error = None if decision is None else decision.exception
    if level < logging.WARNING or error is None:
        logger.log(level, "run=%s type=%s outcome=%s attempt=%d duration=%.3fs", *args)
    else:
        assert decision is not None
        if outcome is Outcome.RETRY and decision.retry_in is not None:
            when = timezone.now() + timedelta(seconds=decision.retry_in)
            next_attempt = when.isoformat(timespec="seconds")
        else:
            next_attempt = "none"
        logger.log(
            level,
            "run=%s type=%s outcome=%s attempt=%d duration=%.3fs error=%s message=%r "
            "next_attempt=%s",
            *args,
            type_name(error),
            clip(message_of(error), MAX_ERROR_MESSAGE),  # as the stored error is cut
            next_attempt,
            exc_info=error,
        )
    for observer in () if late else outcome_observers:
        try:
            observer(claim, outcome, duration)
        except Exception:
            logger.exception("run=%s outcome observer %r failed", claim.run_id, observer)
