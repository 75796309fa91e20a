"""Races between a worker's own threads and other actors, with real worker processes.

Each test starts many runs so that a race that shows in one run out of several
shows in every test run.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from django.db.models import Count

from django_jobs import start, start_many
from django_jobs.models import JobRun, Status
from tests.helpers import WorkerProcess, wait_until
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def test_a_run_past_its_timeout_ends_as_a_timeout_never_as_a_cancel(
    start_worker: StartWorker,
) -> None:
    # The handler calls check_cancel() every few milliseconds, so it notices the
    # watchdog's stop at once: its JobCanceled raced the watchdog's timeout write.
    runs = start_many("tests.timed_cooperative", [{"seconds": 3}] * 40)
    worker = start_worker("--pool", "default", "--concurrency", "4", "--burst")
    assert worker.wait(timeout=120) == 0, worker.output()

    statuses = dict(
        JobRun.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    assert statuses == {Status.TIMED_OUT: len(runs)}, statuses
    for run in JobRun.objects.all():
        # The first attempt's timeout was retried, the second one ended the run.
        assert run.attempts == 2, (run.pk, run.attempts, run.error)
        assert run.error["type"] == "django_jobs.exceptions.JobTimeout", run.error
        assert run.cancel_reason == ""
    starts = Execution.objects.filter(job_type="effect:start")
    assert starts.count() == 2 * len(runs)
    assert "outcome=canceled" not in worker.output()


def _effects(run: JobRun) -> list[tuple[str, int]]:
    rows = Execution.objects.filter(run_id=run.pk).order_by("pk")
    return [(row.job_type.removeprefix("effect:"), row.attempt) for row in rows]


def test_a_run_whose_handler_holds_the_gil_past_the_stale_threshold_is_not_rescued(
    start_worker: StartWorker,
) -> None:
    # The heartbeat thread cannot run for about 6 s; the threshold is 3 s, and
    # a second worker sweeps for stale workers every second.
    run = start("tests.gil_hog", {"seconds": 6})
    hog = start_worker("--pool", "default")
    wait_until(lambda: _effects(run) == [("start", 1)], timeout=30)
    sweeper = start_worker("--pool", "default")
    wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED, timeout=60)
    assert _effects(run) == [("start", 1), ("end", 1)], (hog.output(), sweeper.output())
    assert JobRun.objects.get(pk=run.pk).attempts == 1
    assert "rescued" not in sweeper.output()
    # The watchman's line goes through the worker's buffered log: wait for it a little.
    wait_until(lambda: "the watchman keeps its heartbeat" in hog.output(), timeout=10)
    for worker in (hog, sweeper):
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()


def test_a_stopped_workers_run_is_still_rescued(start_worker: StartWorker) -> None:
    # SIGSTOP: alive, but executing nothing (hung): its watchman keeps no heartbeat.
    run = start("tests.sleep", {"seconds": 30})
    frozen = start_worker("--pool", "default")
    wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.RUNNING, timeout=30)
    frozen.signal(signal.SIGSTOP)
    JobRun.objects.filter(pk=run.pk).update(input={"seconds": 1})  # short the next time
    try:
        rescuer = start_worker("--pool", "default")
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED, timeout=60)
        assert JobRun.objects.get(pk=run.pk).attempts == 2
        assert "rescued runs of stale workers" in rescuer.output()
    finally:
        frozen.signal(signal.SIGCONT)
