"""A handler that chooses its retry's delay (``RetryAfter``), and backoff functions:
under ``drain()``, on a worker in this process, in steps, async, and as a task."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_jobs import JobContext, RetryAfter, RetryPolicy, job
from django_jobs.exceptions import JobsError
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.registry import unregister
from django_jobs.testing import drain
from django_jobs.worker import EXIT_OK, JobWorker
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

RETRY_AFTER = "django_jobs.exceptions.RetryAfter"
# The policy's own delay, so that a run_at near a RetryAfter's delay is the handler's.
HOUR = RetryPolicy(attempts=3, base_delay=3600, jitter=False)


@pytest.fixture
def handlers() -> Iterator[Callable[..., Any]]:
    """``@job`` for this test only: every job type it registers is unregistered after."""
    registered: list[str] = []

    def register(job_type: str, **options: Any) -> Callable[[Any], Any]:
        registered.append(job_type)
        return job(job_type, **options)

    yield register
    for job_type in registered:
        unregister(job_type)


def refreshed(run: JobRun) -> JobRun:
    run.refresh_from_db()
    return run


def assert_due_in(run: JobRun, seconds: float, before: datetime, after: datetime) -> None:
    """``run_at`` is ``seconds`` after a moment between ``before`` and ``after`` (the
    database's clock and this process's may differ by a little: a second allowed)."""
    delay = timedelta(seconds=seconds)
    slack = timedelta(seconds=1)
    assert before + delay - slack <= run.run_at <= after + delay + slack, (
        run.run_at - before,
        delay,
    )


def mark(ctx: JobContext, name: str) -> int:
    """Count a call of ``name`` (an Execution row)."""
    return Execution.objects.create(
        run_id=ctx.run_id, job_type=name, attempt=ctx.attempt, pid=os.getpid()
    ).pk


def attempt_once(run: JobRun) -> JobRun:
    before = timezone.now()
    assert drain() == 1
    run = refreshed(run)
    run.checked_between = (before, timezone.now())  # type: ignore[attr-defined]
    return run


class TestUnderDrain:
    def test_the_handlers_delay_replaces_the_policys_backoff(
        self, handlers: Callable[..., Any]
    ) -> None:
        # max_delay, jitter and non_retryable are the policy's backoff: not applied.
        policy = RetryPolicy(
            attempts=3, base_delay=3600, max_delay=7200, jitter=True, non_retryable=[JobsError]
        )

        @handlers("retry_after.throttled", retry=policy)
        def throttled(ctx: JobContext) -> None:
            raise RetryAfter(timedelta(minutes=5), "429 from the API")

        run = attempt_once(throttled.start())
        assert (run.status, run.attempts, run.claimed_by_id) == (Status.PENDING, 1, None)
        assert_due_in(run, 300, *run.checked_between)  # type: ignore[attr-defined]
        assert run.error["type"] == RETRY_AFTER
        assert run.error["message"] == "retry in 300s: 429 from the API"
        assert (run.error["attempt"], run.error["retryable"]) == (1, True)

    def test_a_run_without_a_policy_fails_with_the_retry_after_recorded(
        self, handlers: Callable[..., Any]
    ) -> None:
        @handlers("retry_after.once")
        def once(ctx: JobContext) -> None:
            raise RetryAfter(30)

        run = attempt_once(once.start())
        assert (run.status, run.attempts) == (Status.FAILED, 1)
        assert run.error["type"] == RETRY_AFTER
        assert run.error["message"].startswith("retry in 30s (on the last attempt, 1 of 1:")
        assert "RetryPolicy(attempts=N)" in run.error["message"]

    def test_it_spends_attempts_and_the_last_one_fails_the_run(
        self, handlers: Callable[..., Any]
    ) -> None:
        @handlers("retry_after.always", retry=RetryPolicy(attempts=3, base_delay=3600))
        def always(ctx: JobContext) -> None:
            mark(ctx, "always")
            raise RetryAfter(0)  # due again at once: drain() runs every attempt

        run = always.start()
        assert drain() == 3
        run = refreshed(run)
        assert (run.status, run.attempts, run.error["attempt"]) == (Status.FAILED, 3, 3)
        assert "3 of 3" in run.error["message"]
        assert list(Execution.objects.values_list("attempt", flat=True).order_by("id")) == [
            1,
            2,
            3,
        ]

    def test_a_bad_delay_is_the_handlers_error_not_the_workers(
        self, handlers: Callable[..., Any]
    ) -> None:
        @handlers("retry_after.negative")
        def negative(ctx: JobContext) -> None:
            raise RetryAfter(-5)

        run = attempt_once(negative.start())
        assert (run.status, run.error["type"]) == (Status.FAILED, "builtins.ValueError")
        assert run.error["message"] == (
            "RetryAfter's delay must be from 0 to 604800 seconds (a week), got -5"
        )

    def test_in_a_step_the_step_records_it_and_runs_again_next_attempt(
        self, handlers: Callable[..., Any]
    ) -> None:
        @handlers("retry_after.in_step", retry=HOUR)
        def in_step(ctx: JobContext) -> int:
            def call() -> int:
                mark(ctx, "call")
                if ctx.attempt == 1:
                    raise RetryAfter(0, "busy")
                return 7

            ctx.step("before", lambda: mark(ctx, "before"))
            return int(ctx.step("call", call))

        run = in_step.start()
        assert drain() == 2
        run = refreshed(run)
        assert (run.status, run.output, run.attempts) == (Status.COMPLETED, 7, 2)
        assert Execution.objects.filter(job_type="before").count() == 1  # replayed
        assert Execution.objects.filter(job_type="call").count() == 2  # asked again
        # The run keeps the error of the attempt that asked; the step was recorded
        # failed with it, then completed on the next attempt.
        assert (run.error["type"], run.error["message"]) == (RETRY_AFTER, "retry in 0s: busy")
        step = JobStep.objects.get(run=run, step_id="call")
        assert (step.status, step.output) == ("completed", 7)

    def test_a_step_that_asks_is_recorded_failed_with_it(
        self, handlers: Callable[..., Any]
    ) -> None:
        def call() -> None:
            raise RetryAfter(90)

        @handlers("retry_after.step_pending", retry=HOUR)
        def step_pending(ctx: JobContext) -> None:
            ctx.step("call", call)

        run = attempt_once(step_pending.start())
        assert run.status == Status.PENDING
        assert_due_in(run, 90, *run.checked_between)  # type: ignore[attr-defined]
        step = JobStep.objects.get(run=run, step_id="call")
        assert step.status == "failed"
        assert (step.error["type"], step.error["retryable"]) == (RETRY_AFTER, True)

    def test_an_async_handler_asks_from_a_step(self, handlers: Callable[..., Any]) -> None:
        @handlers("retry_after.async", retry=HOUR)
        async def asks(ctx: JobContext) -> None:
            async def call() -> None:
                raise RetryAfter(120.5)

            await ctx.astep("call", call)

        run = attempt_once(asks.start())
        assert (run.status, run.error["type"]) == (Status.PENDING, RETRY_AFTER)
        assert_due_in(run, 120.5, *run.checked_between)  # type: ignore[attr-defined]
        assert JobStep.objects.get(run=run, step_id="call").status == "failed"


class TestBackoffFunctions:
    def test_the_functions_delay_sets_run_at(self, handlers: Callable[..., Any]) -> None:
        seen: list[int] = []

        def by_attempt(attempt: int) -> timedelta:
            seen.append(attempt)
            return timedelta(minutes=10 * attempt)

        policy = RetryPolicy(attempts=3, backoff=by_attempt, jitter=False)

        @handlers("retry_after.by_function", retry=policy)
        def fails(ctx: JobContext) -> None:
            raise ConnectionError("down")

        run = attempt_once(fails.start())
        assert (run.status, seen) == (Status.PENDING, [1])
        assert_due_in(run, 600, *run.checked_between)  # type: ignore[attr-defined]

    def test_a_bad_value_is_logged_and_the_exponential_backoff_used(
        self, handlers: Callable[..., Any], caplog: pytest.LogCaptureFixture
    ) -> None:
        policy = RetryPolicy(attempts=3, backoff=lambda attempt: "soon", base_delay=120)

        @handlers("retry_after.bad_function", retry=policy)
        def fails(ctx: JobContext) -> None:
            raise ConnectionError("down")

        with caplog.at_level(logging.ERROR, logger="django_jobs.backoff"):
            run = attempt_once(fails.start())
        assert run.status == Status.PENDING
        # Full jitter of the exponential backoff's first delay: within 120 s.
        before, after = run.checked_between  # type: ignore[attr-defined]
        assert before - timedelta(seconds=1) <= run.run_at <= after + timedelta(seconds=121)
        (record,) = caplog.records
        assert "TestBackoffFunctions" in record.getMessage()
        assert "<lambda>(1) must be seconds or a timedelta, got 'soon'" in record.getMessage()
        assert "using the exponential backoff" in record.getMessage()


@pytest.mark.django_db(transaction=True)
class TestOnAWorker:
    """A JobWorker in this process (the threads, and the event loop for async def)."""

    @pytest.mark.parametrize("kind", ["sync", "async"])
    def test_the_retry_is_due_when_the_handler_said(
        self, handlers: Callable[..., Any], kind: str
    ) -> None:
        if kind == "sync":

            @handlers("retry_after.worker", retry=HOUR)
            def handler(ctx: JobContext) -> None:
                raise RetryAfter(45)

        else:

            @handlers("retry_after.worker", retry=HOUR)
            async def handler(ctx: JobContext) -> None:
                raise RetryAfter(45)

        run = handler.start()
        worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
        before = timezone.now()
        assert worker.run() == EXIT_OK
        after = timezone.now()
        run = refreshed(run)
        assert (run.status, run.attempts, run.error["type"]) == (Status.PENDING, 1, RETRY_AFTER)
        assert_due_in(run, 45, before, after)
