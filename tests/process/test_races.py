"""Races between a worker's own threads and other actors, with real worker processes.

Each test starts many runs so that a race that shows in one run out of several
shows in every test run.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db.models import Count

from django_jobs import start_many
from django_jobs.models import JobRun, Status
from tests.helpers import WorkerProcess
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
