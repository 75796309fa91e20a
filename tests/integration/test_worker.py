"""The Worker loop run in this process (the process tests run it as a command).

Its runs, its shutdown and its heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import transaction

from django_jobs import JobContext, cancel, job, retry, start, start_many, transitions
from django_jobs.models import JobRun, Status, Worker, WorkerStatus
from django_jobs.worker import EXIT_OK, EXIT_RELEASED, JobWorker
from tests.helpers import in_thread, status_of, wait_until
from tests.testapp.jobs import effect
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_burst_runs_every_due_run_and_exits() -> None:
    start_many("tests.noop", [{} for _ in range(120)])
    start("tests.flaky", {"succeed_on": 2})
    worker = JobWorker(["default"], concurrency=4, burst=True, poll_interval=0.05)
    assert worker.run() == EXIT_OK
    assert set(JobRun.objects.values_list("status", flat=True)) == {Status.COMPLETED}
    assert worker.claimed == worker.finished == 122
    row = Worker.objects.get(pk=worker.worker_id)
    assert (row.status, row.concurrency, row.pools) == (WorkerStatus.STOPPED, 4, ["default"])


def test_max_runs_stops_after_that_many() -> None:
    start_many("tests.noop", [{} for _ in range(10)])
    worker = JobWorker(["default"], concurrency=2, max_runs=3, poll_interval=0.05)
    assert worker.run() == EXIT_OK
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 3
    assert JobRun.objects.filter(status=Status.PENDING).count() == 7


def test_only_the_workers_pools_are_claimed() -> None:
    start("tests.echo", {})
    start("tests.noop")
    assert JobWorker(["echo"], burst=True, poll_interval=0.05).run() == EXIT_OK
    assert dict(JobRun.objects.values_list("job_type", "status")) == {
        "tests.echo": Status.COMPLETED,
        "tests.noop": Status.PENDING,
    }


def run_in_thread(worker: JobWorker) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def target() -> None:
        from django.db import connections

        try:
            result["code"] = worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def test_stop_drains_in_flight_runs(settings: Any) -> None:
    run = start("tests.sleep", {"seconds": 0.5})
    worker = JobWorker(["default"], poll_interval=0.05)
    thread, result = run_in_thread(worker)
    wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.RUNNING)
    worker.request_stop()
    thread.join(20)
    assert result["code"] == EXIT_OK
    assert JobRun.objects.get(pk=run.pk).status == Status.COMPLETED


def test_stop_twice_releases_the_run_without_spending_an_attempt() -> None:
    run = start("tests.sleep", {"seconds": 3})
    worker = JobWorker(["default"], poll_interval=0.05)
    thread, result = run_in_thread(worker)
    wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.RUNNING)
    worker.request_stop()
    worker.request_stop()
    thread.join(20)
    assert result["code"] == EXIT_RELEASED
    run.refresh_from_db()
    assert (run.status, run.attempts, run.claimed_by_id) == (Status.PENDING, 0, None)


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        JobWorker(["default"], concurrency=0)
    with pytest.raises(ValueError, match="pool"):
        JobWorker([])


# --- a worker in a thread, and handlers that outlast a cancel or their timeout -----------


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


def count(run: JobRun, name: str) -> int:
    return Execution.objects.filter(run_id=run.pk, job_type=f"effect:{name}").count()


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


# --- shutdown releases every run this worker still executes ------------------------------


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
        # The second execution outlasts the first by seconds, not by the grace and
        # the claim alone: on a loaded machine the checks below take time.
        JobRun.objects.filter(pk=run.pk).update(input={"seconds": 8})
        retry(run.pk)
        # The same worker claims the run again while the first handler still sleeps.
        wait_until(lambda: count(run, "began") == 2, timeout=10)
        wait_until(lambda: count(run, "ended") == 1, timeout=10)  # first handler returned
        assert status_of(run) == Status.RUNNING  # the second execution is under way
        worker.request_stop()
        wait_until(lambda: Worker.objects.get(pk=worker.worker_id).stopped_at is not None)
        state = status_of(run)
    wait_until(lambda: count(run, "ended") == 2, timeout=20)  # let the handler finish
    # A stopping worker lets in-flight runs finish up to the shutdown timeout, then
    # release them to pending. The worker exited at once and left it running.
    assert state == Status.PENDING


# --- the heartbeat: a long job on a live worker is never rescued -------------------------


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
            sweeper, swept = in_thread(lambda: transitions.rescue_stale(["review"], stale_after))
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
        wait_until(lambda: worker.control is not None)
        control = worker.control
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
