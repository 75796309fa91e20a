"""@task functions on real runjobworker processes: a killed worker, a canceled task."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from django_jobs import cancel
from django_jobs.exceptions import JobCanceled
from django_jobs.models import JobRun, Status, Worker
from django_jobs.tasks_backend import run_id
from django_jobs.tasks_compat import TaskResultStatus
from tests.helpers import WorkerProcess, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def status_of(result_id: str) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run_id(result_id))


def test_a_task_whose_worker_is_killed_is_rescued_and_run_again(
    start_worker: StartWorker,
) -> None:
    result = tasks.nap.enqueue(seconds=1.5)  # its policy allows two attempts
    victim = start_worker("--pool", "tasks")
    wait_until(lambda: Execution.objects.filter(run_id=run_id(result.id)).exists())
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    start_worker("--pool", "tasks")
    # The stale threshold is 3 s in the test settings.
    wait_until(lambda: status_of(result.id) == Status.COMPLETED, timeout=30)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2  # the attempt its TaskContext reported
    first, second = Worker.objects.order_by("started_at").values_list("id", flat=True)
    assert result.worker_ids == [str(first), str(second)]
    attempts = Execution.objects.filter(run_id=run_id(result.id)).values_list("attempt", flat=True)
    assert sorted(attempts) == [1, 2]


def test_a_running_task_that_never_checks_is_canceled_after_the_grace(
    start_worker: StartWorker,
) -> None:
    result = tasks.nap.enqueue(seconds=4)
    worker = start_worker("--pool", "tasks", DJANGO_JOBS_CANCEL_GRACE="0.5")
    wait_until(lambda: Execution.objects.filter(run_id=run_id(result.id)).exists())
    assert cancel(run_id(result.id), reason="operator") == 1
    wait_until(lambda: status_of(result.id) == Status.CANCELED, timeout=15)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is JobCanceled
    assert result.errors[0].traceback.startswith("JobCanceled: operator (the handler ignored")
    assert result.attempts == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


def test_async_tasks_run_together_on_the_event_loop(start_worker: StartWorker) -> None:
    results = [tasks.together_async.enqueue(n=20) for _ in range(20)]
    worker = start_worker("--pool", "tasks", "--concurrency", "1", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        # Every one saw all twenty running at once, with one thread for sync runs.
        assert result.return_value == 20


def test_an_async_task_whose_worker_is_killed_is_run_again(start_worker: StartWorker) -> None:
    result = tasks.nap_async.enqueue(seconds=30)
    victim = start_worker("--pool", "tasks")
    wait_until(lambda: Execution.objects.filter(run_id=run_id(result.id)).exists())
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    JobRun.objects.filter(pk=run_id(result.id)).update(input={"args": [], "kwargs": {"seconds": 0}})
    start_worker("--pool", "tasks")
    wait_until(lambda: status_of(result.id) == Status.COMPLETED, timeout=30)
    result.refresh()
    assert result.return_value == 2
    attempts = Execution.objects.filter(run_id=run_id(result.id)).values_list("attempt", flat=True)
    assert sorted(attempts) == [1, 2]


def test_a_failed_tasks_exception_adds_no_line_to_the_worker_log(start_worker: StartWorker) -> None:
    """Django's tasks framework logs a failed task with its traceback (its
    ``task_finished`` receiver): that record, too, writes a message's line
    breaks escaped, whatever handler writes it."""
    forged = "\n2026-12-05 07:00:00,000 INFO django_jobs.execution run=1 outcome=completed"
    tasks.boom.enqueue("bad" + forged + "\n")
    worker = start_worker("--pool", "default", "--burst")
    assert worker.wait(timeout=60) == 0
    output = worker.output()
    assert "run=1 outcome=completed" in output  # the message is shown ...
    assert not [
        line for line in output.splitlines() if line.startswith("2026-12-05 07:00:00,000")
    ], output  # ... but on no line of its own
