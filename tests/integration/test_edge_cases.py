"""Edge cases found in review: each test states a contract rule (DESIGN.md) that must hold."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections, transaction

from django_jobs import JobContext, RetryPolicy, cancel, claims, job, lifecycle, retry, start
from django_jobs.execution import Outcome, execute
from django_jobs.models import JobRun, Status, Worker
from django_jobs.worker import Worker as JobWorker
from tests.factories import WorkerFactory
from tests.helpers import lock_waiters, wait_until
from tests.testapp.jobs import effect
from tests.testapp.models import Execution

# --- handlers used only here ------------------------------------------------------------


class UnprintableError(Exception):
    """An exception whose message cannot be rendered (a buggy third-party exception)."""

    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


@job("review.unprintable_error")
def unprintable_error(ctx: JobContext) -> None:
    raise UnprintableError()


@job("review.atomic_sleeper")
def atomic_sleeper(ctx: JobContext) -> str:
    # A handler that keeps its own work in one transaction (as @transaction.atomic would).
    with transaction.atomic():
        ctx.step("before", lambda: 1)
        ctx.sleep("nap", 3600)
    return "rested"


@job("review.nul_error", retry=RetryPolicy(attempts=3, base_delay=0, jitter=False))
def nul_error(ctx: JobContext) -> None:
    raise RuntimeError("bad byte \x00 in a message from a C library")


@job("review.ignores_cancel", pool="review")
def ignores_cancel(ctx: JobContext) -> str:
    effect(ctx, "began")
    time.sleep(ctx.input.get("seconds", 4))
    effect(ctx, "ended")
    return "done"


@job("review.short_timeout", pool="review", timeout=1.0)
def short_timeout(ctx: JobContext) -> str:
    effect(ctx, "began")
    time.sleep(ctx.input.get("seconds", 6))
    return "too late"


# --- helpers ----------------------------------------------------------------------------


def count(run: JobRun, name: str) -> int:
    return Execution.objects.filter(run_id=run.pk, job_type=f"effect:{name}").count()


def status_of(run: JobRun) -> str:
    return str(JobRun.objects.values_list("status", flat=True).get(pk=run.pk))


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on its own thread (so on its own database connection)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


@contextmanager
def worker_in_thread(pools: list[str], concurrency: int) -> Iterator[JobWorker]:
    worker = JobWorker(pools, concurrency=concurrency, poll_interval=0.05)
    thread, _ = in_thread(worker.run)
    try:
        wait_until(lambda: worker.worker_id is not None, timeout=10)
        yield worker
    finally:
        worker.request_stop()
        worker.request_stop()
        thread.join(30)


# --- rule 15: never a run stuck in running on a live worker ------------------------------


@pytest.mark.django_db
def test_an_exception_whose_str_raises_still_ends_the_run() -> None:
    run = start("review.unprintable_error")
    (claim,) = claims.claim_batch(WorkerFactory().pk, None, 1)
    try:
        execute(claim)  # documented: "Never raises for the run"
    except Exception as exc:
        pytest.fail(f"execute() raised {exc!r}; run left {status_of(run)}")
    assert status_of(run) == Status.FAILED


@pytest.mark.django_db
def test_a_durable_sleep_inside_the_handlers_own_transaction_is_not_lost() -> None:
    run = start("review.atomic_sleeper")
    (claim,) = claims.claim_batch(WorkerFactory().pk, None, 1)
    outcome = execute(claim)
    # Either the sleep is recorded (waiting) or the handler is told it cannot sleep
    # there (failed); never "running" under a lease nobody will ever write again.
    assert (outcome, status_of(run)) in {
        (Outcome.WAITING, Status.WAITING),
        (Outcome.FAILED, Status.FAILED),
    }


@pytest.mark.django_db(transaction=True)
def test_a_retryable_error_with_a_nul_in_its_message_is_retried() -> None:
    run = start("review.nul_error")
    (claim,) = claims.claim_batch(WorkerFactory().pk, None, 1)
    execute(claim)
    run.refresh_from_db()
    assert run.status == Status.PENDING, run.error["message"]
    assert run.error["type"] == "builtins.RuntimeError"


# --- rule 10: a cancel request is not parked behind a suspension -------------------------


@pytest.mark.django_db
def test_a_cancel_requested_before_a_durable_sleep_is_not_deferred_until_it_wakes() -> None:
    run = start("tests.sleeper", {"seconds": 3600})
    (claim,) = claims.claim_batch(WorkerFactory().pk, None, 1)
    assert cancel(run.pk) == 1  # running: asked to cancel
    # The worker has not polled the request yet (it does so once per heartbeat).
    execute(claim)
    run.refresh_from_db()
    assert run.status == Status.CANCELED, (run.status, run.run_at)


@pytest.mark.django_db
def test_a_cancel_requested_before_wait_for_terminates_the_children() -> None:
    parent = start("tests.parent", {"n": 2})
    (claim,) = claims.claim_batch(WorkerFactory().pk, ["default"], 1)
    assert cancel(parent.pk) == 1
    execute(claim)  # spawns two children, then wait_for() suspends
    parent.refresh_from_db()
    children = list(JobRun.objects.filter(parent=parent).values_list("status", flat=True))
    assert (parent.status, children) == (Status.CANCELED, [Status.CANCELED] * 2)


# --- deadlocks: a child completing while its parent is canceled --------------------------


@pytest.mark.django_db(transaction=True)
def test_canceling_a_waiting_parent_while_its_child_completes_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = WorkerFactory()
    parent = start("tests.parent", {"n": 1})  # the child is a tests.echo, pool "echo"
    (parent_claim,) = claims.claim_batch(worker.pk, ["default"], 1)
    assert execute(parent_claim) is Outcome.WAITING
    (child_claim,) = claims.claim_batch(worker.pk, ["echo"], 1)

    # Hold the child's completion between its fenced UPDATE (child row locked) and
    # the wake-up of its parent (parent row locked next): the real order of _write.
    child_row_locked, go_on = threading.Event(), threading.Event()
    real_after_end = lifecycle.after_end

    def after_end(*args: Any) -> int:
        child_row_locked.set()
        go_on.wait(10)
        return real_after_end(*args)

    monkeypatch.setattr(lifecycle, "after_end", after_end)
    child_thread, _ = in_thread(lambda: execute(child_claim))
    assert child_row_locked.wait(10)
    cancel_thread, canceled = in_thread(lambda: cancel(parent.pk))
    wait_until(lambda: lock_waiters() >= 1, timeout=10)  # cancel() waits for the child row
    go_on.set()
    child_thread.join(30)
    cancel_thread.join(30)
    assert "error" not in canceled, f"cancel() raised {canceled.get('error')!r}"


# --- rule 5: shutdown releases every run this worker still executes ----------------------


@pytest.mark.django_db(transaction=True)
def test_a_rerun_of_a_fenced_off_run_on_the_same_worker_is_released_at_shutdown(
    settings: Any,
) -> None:
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "CANCEL_GRACE": 0.3,
        "SHUTDOWN_TIMEOUT": 0.5,
    }
    run = start("review.ignores_cancel", {"seconds": 4}, pool="review")
    with worker_in_thread(["review"], concurrency=2) as worker:
        wait_until(lambda: count(run, "began") == 1)
        assert cancel(run.pk) == 1
        # The handler ignores the request: after CANCEL_GRACE it is fenced, still sleeping.
        wait_until(lambda: status_of(run) == Status.CANCELED, timeout=10)
        retry(run.pk)
        # The same worker claims the run again while the first handler still sleeps.
        wait_until(lambda: count(run, "began") == 2, timeout=10)
        wait_until(lambda: count(run, "ended") == 1, timeout=10)  # first handler returned
        assert status_of(run) == Status.RUNNING  # the second execution is under way
        worker.request_stop()
        wait_until(lambda: Worker.objects.get(pk=worker.worker_id).stopped_at is not None)
        state = status_of(run)
    wait_until(lambda: count(run, "ended") == 2, timeout=10)  # let the handler finish
    # DESIGN rule 5: let in-flight runs finish up to the shutdown timeout, then
    # release them to pending. The worker exited at once and left it running.
    assert state == Status.PENDING


# --- rule 4: a long job on a live worker is never rescued --------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_lock_wait_in_the_watchdog_does_not_stop_the_heartbeat(settings: Any) -> None:
    stale_after = settings.DJANGO_JOBS["STALE_THRESHOLD"]
    slow = start("review.short_timeout", {"seconds": 6})
    long = start("review.ignores_cancel", {"seconds": 6}, pool="review")
    with worker_in_thread(["review"], concurrency=2):
        wait_until(lambda: count(slow, "began") == 1 and count(long, "began") == 1)
        # A user cancels in a transaction that stays open a while (ATOMIC_REQUESTS, a
        # bulk cancel loop): the row stays locked. When `slow` passes its timeout the
        # watchdog waits for that lock, on the thread that also sends heartbeats.
        with transaction.atomic():
            cancel(slow.pk)
            time.sleep(stale_after + 1.5)
            # Meanwhile any other worker sweeps, as every worker does each heartbeat.
            sweeper, swept = in_thread(lambda: claims.rescue_stale(["review"], stale_after))
            sweeper.join(10)
        long_status = status_of(long)
    wait_until(lambda: count(long, "ended") >= 1, timeout=15)
    assert swept["value"] == (0, 0), f"rescued a live worker's runs; long run is {long_status}"


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_goes_on_while_the_shared_connection_is_held(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A control thread may hold the shared connection long (a slow signal
    receiver runs under it): the heartbeat is then written on its own."""
    from django.db.models import F
    from django.db.models.functions import Now

    stale_after = settings.DJANGO_JOBS["STALE_THRESHOLD"]
    with worker_in_thread(["review"], concurrency=1) as worker:
        wait_until(lambda: worker._control is not None)
        control = worker._control
        assert control is not None
        assert control.enter()
        try:
            time.sleep(stale_after + 1.5)
            age = (
                Worker.objects.annotate(age=Now() - F("heartbeat_at"))
                .values_list("age", flat=True)
                .get(pk=worker.worker_id)
            )
        finally:
            control.__exit__(None, None, None)
    assert age.total_seconds() < stale_after, age
    assert "the control connection was busy" in caplog.text


# --- rule 10: cascade=False means the same thing for running and waiting runs ------------


@pytest.mark.django_db
def test_cancel_without_cascade_of_a_running_parent_leaves_its_children() -> None:
    start("tests.parent", {"n": 2})
    (claim,) = claims.claim_batch(WorkerFactory().pk, ["default"], 1)
    child = JobContext(claim).spawn_child("tests.echo", {"i": 0})
    assert cancel(claim.run_id, cascade=False) == 1
    # A second execution under the same claim: it must look up the step just recorded.
    ctx = JobContext(dataclasses.replace(claim, has_steps=True))
    ctx.request_cancel()  # the worker noticed the request; the next step raises JobCanceled
    assert execute(claim, ctx=ctx) is Outcome.CANCELED
    # A waiting parent canceled with cascade=False keeps its children; a running one
    # loses them when it ends canceled, because after_end() ignores the flag.
    assert status_of(child) == Status.PENDING
