"""Run one claimed run and record its outcome with fenced updates."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from enum import StrEnum
from functools import partial
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from . import claims
from .claims import Claim
from .context import JobContext
from .exceptions import InvalidJobInput, UnknownJobType
from .payloads import normalize
from .registry import JobHandler, get_handler

logger = logging.getLogger(__name__)


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"
    LOST = "lost"  # the lease was gone when the outcome was written: nothing written


def error_record(error: BaseException, attempt: int, *, retryable: bool) -> dict[str, Any]:
    """Describe ``error`` for ``JobRun.error``: type, message, traceback, attempt."""
    cls = type(error)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "attempt": attempt,
        "retryable": retryable,
    }


def execute(claim: Claim, *, stop: threading.Event | None = None) -> Outcome:
    """Run the handler of ``claim`` and record what happened. Never raises for the run.

    ``stop`` is the worker's hard-stop event: outcome writes that fail on a dropped
    connection are retried until they land or it is set.
    """
    started = time.monotonic()
    try:
        handler = get_handler(claim.row["job_type"])
    except UnknownJobType as exc:
        # start() refuses unknown types, so this is a deploy where this worker
        # lacks a handler the enqueuer had. Fail it visibly; it can be retried.
        write = _fail(claim, error_record(exc, claim.attempt, retryable=False))
    else:
        write = _run_handler(handler, claim)
    outcome = _settle(claim, write, stop)
    _log(claim, outcome, started)
    return outcome


def _run_handler(handler: JobHandler, claim: Claim) -> Callable[[], Outcome]:
    """Call the handler and return the write that records its result (not yet done)."""
    ctx = JobContext(claim)
    try:
        result = handler(ctx)
    except BaseException as exc:  # a handler's SystemExit ends its run, not the worker
        return _on_error(handler, claim, exc)
    try:
        output = normalize(result, what=f"the output of {handler.job_type} run {claim.run_id}")
    except InvalidJobInput as exc:
        # Running the same code again would return the same value: not retryable.
        return _fail(claim, error_record(exc, claim.attempt, retryable=False))
    return partial(_write, claims.complete, claim, output, Outcome.COMPLETED)


def _on_error(handler: JobHandler, claim: Claim, exc: BaseException) -> Callable[[], Outcome]:
    policy = handler.retry
    if policy.should_retry(exc, claim.attempt):
        error = error_record(exc, claim.attempt, retryable=True)
        delay = policy.delay(claim.attempt)
        return partial(_write, claims.reschedule, claim, error, Outcome.RETRY, delay)
    return _fail(claim, error_record(exc, claim.attempt, retryable=policy.is_retryable(exc)))


def _fail(claim: Claim, error: dict[str, Any]) -> Callable[[], Outcome]:
    return partial(_write, claims.fail, claim, error, Outcome.FAILED)


def _write(
    fenced: Callable[..., bool], claim: Claim, value: Any, outcome: Outcome, *args: Any
) -> Outcome:
    """Perform one fenced write; a lost lease turns the outcome into LOST."""
    return outcome if fenced(claim, value, *args) else Outcome.LOST


def _settle(claim: Claim, write: Callable[[], Outcome], stop: threading.Event | None) -> Outcome:
    """Perform an outcome write, riding out a dropped database connection.

    A write that fails because the connection broke is retried on a fresh one,
    with a capped backoff, until it lands or the worker is told to stop hard (then
    the run stays ``running`` under this lease and is released or rescued).
    Any other database error is recorded as the run's failure instead.
    """
    delay = 0.2
    rejected = False
    while True:
        discard_broken_connections()
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            logger.warning(
                "run=%s outcome not written, database unavailable (%s); retrying in %.1fs",
                claim.run_id,
                type(exc).__name__,
                delay,
            )
        except DatabaseError as exc:
            logger.error("run=%s outcome rejected by the database: %s", claim.run_id, exc)
            if rejected:
                return Outcome.LOST
            rejected = True
            write = _fail(claim, error_record(exc, claim.attempt, retryable=False))
            continue
        if stop is not None and stop.wait(delay):
            return Outcome.LOST
        if stop is None:
            time.sleep(delay)
        delay = min(delay * 2, 5.0)


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


def _log(claim: Claim, outcome: Outcome, started: float) -> None:
    logger.info(
        "run=%s type=%s outcome=%s attempt=%d duration=%.3fs",
        claim.run_id,
        claim.row["job_type"],
        outcome.value,
        claim.attempt,
        time.monotonic() - started,
    )
