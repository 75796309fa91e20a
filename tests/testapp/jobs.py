"""Handlers the tests run; each records its calls in Execution when asked to."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django_jobs import JobContext, RetryPolicy, job

from .models import Execution


class PermanentError(Exception):
    """Raised by a handler that must not be retried."""


class CodedError(Exception):
    code = "E_CARD_DECLINED"


def record(ctx: JobContext) -> None:
    Execution.objects.create(
        run_id=ctx.run_id, job_type=ctx.job_type, attempt=ctx.attempt, pid=os.getpid()
    )


@job("tests.noop")
def noop(ctx: JobContext) -> None:
    return None


@job("tests.echo", pool="echo")
def echo(ctx: JobContext) -> Any:
    return ctx.input


@job("tests.record")
def record_run(ctx: JobContext) -> dict[str, int]:
    record(ctx)
    return {"attempt": ctx.attempt}


@job("tests.flaky", retry=RetryPolicy(attempts=3, base_delay=0, jitter=False))
def flaky(ctx: JobContext) -> dict[str, int]:
    """Fail until the attempt given as input["succeed_on"]."""
    record(ctx)
    if ctx.attempt < ctx.input.get("succeed_on", 99):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@job(
    "tests.permanent",
    retry=RetryPolicy(attempts=5, base_delay=0, non_retryable=[PermanentError, "E_CARD_DECLINED"]),
)
def permanent(ctx: JobContext) -> None:
    record(ctx)
    if ctx.input.get("coded"):
        raise CodedError("card declined")
    raise PermanentError("this will never work")


@job("tests.backoff", retry=RetryPolicy(attempts=3, base_delay=3600, jitter=False))
def backoff(ctx: JobContext) -> None:
    raise RuntimeError("try again in an hour")


@job("tests.sleep", retry=RetryPolicy(attempts=3, base_delay=0))
def sleep(ctx: JobContext) -> dict[str, float]:
    record(ctx)
    time.sleep(ctx.input.get("seconds", 1.0))
    return {"slept": ctx.input.get("seconds", 1.0)}


@job("tests.poison", retry=RetryPolicy(attempts=2, base_delay=0))
def poison(ctx: JobContext) -> None:
    """Kill the worker process running it, as an out-of-memory kill would."""
    record(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


@job("tests.bad_output")
def bad_output(ctx: JobContext) -> object:
    return object()


@job("tests.system_exit")
def system_exit(ctx: JobContext) -> None:
    raise SystemExit(3)


@job("tests.priority", pool="prio")
def priority(ctx: JobContext) -> None:
    record(ctx)
