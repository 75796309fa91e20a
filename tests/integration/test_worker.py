"""The Worker loop run in this process (the process tests run it as a command)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_jobs import start, start_many
from django_jobs.models import JobRun, Status, Worker, WorkerStatus
from django_jobs.worker import EXIT_OK, EXIT_RELEASED
from django_jobs.worker import Worker as JobWorker
from tests.helpers import wait_until

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
