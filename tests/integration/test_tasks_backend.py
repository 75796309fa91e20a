"""JobsBackend: @task functions enqueued, run by django_jobs, and read back as TaskResults.

Runs on Django 6 (django.tasks) and on Django 5.2 with the django-tasks backport.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_jobs import RetryAfter, RetryPolicy, cancel, retry, start, transitions
from django_jobs.exceptions import JobCanceled, JobTimeout, WorkerLost
from django_jobs.execution import execute
from django_jobs.models import JobRun, Status, Worker
from django_jobs.signals import run_failed
from django_jobs.storage import claiming, workers
from django_jobs.tasks_backend import JobsBackend, JobsTask, run_id
from django_jobs.tasks_compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_jobs.testing import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = "django_jobs.tasks_backend.JobsBackend"


@pytest.fixture
def events() -> Iterator[list[tuple[str, Any, str, str]]]:
    """(signal, sender, result id, status) for every task signal sent."""
    seen: list[tuple[str, Any, str, str]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, sender, task_result.id, task_result.status))

        return receive

    receivers = {
        signal: receiver(name)
        for name, signal in [
            ("enqueued", task_enqueued),
            ("started", task_started),
            ("finished", task_finished),
        ]
    }
    for signal, receive in receivers.items():
        signal.connect(receive)
    yield seen
    for signal, receive in receivers.items():
        signal.disconnect(receive)


def finished(result: Any) -> Any:
    drain()
    result.refresh()
    return result


def test_enqueue_inserts_a_run_in_the_callers_transaction() -> None:
    with transaction.atomic():
        result = tasks.echo.enqueue(1, "two", three=[3])
        run = JobRun.objects.get(pk=run_id(result.id))
    assert (run.job_type, run.pool, run.priority) == ("tests.testapp.tasks.echo", "tasks", 5)
    assert (run.trigger_source, run.trigger_ref) == ("task", "default")
    assert run.input == {"args": [1, "two"], "kwargs": {"three": [3]}}
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.attempts) == ([1, "two"], {"three": [3]}, 0)
    assert result.enqueued_at == run.created_at
    assert isinstance(result.task, JobsTask)
    assert result.task == tasks.echo

    try:
        with transaction.atomic():
            gone = tasks.add.enqueue(1, 2)
            raise ZeroDivisionError
    except ZeroDivisionError:
        pass
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(gone.id)


def test_successful_result(events: list[Any]) -> None:
    result = finished(tasks.add.enqueue(2, 3))
    run = JobRun.objects.get(pk=run_id(result.id))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.worker_ids == [str(run.claimed_by_id)] == run.worker_ids
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    sender = type(task_backends["default"])
    assert events == [
        ("enqueued", sender, result.id, TaskResultStatus.READY),
        ("started", sender, result.id, TaskResultStatus.RUNNING),
        ("finished", sender, result.id, TaskResultStatus.SUCCESSFUL),
    ]


def test_failed_result(events: list[Any]) -> None:
    result = finished(tasks.boom.enqueue("no luck"))
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.traceback.startswith("Traceback")
    assert error.traceback.endswith("ValueError: no luck\n")
    assert [(name, status) for name, _, _, status in events] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]


def test_retries_follow_the_tasks_policy_and_the_context_counts_attempts(
    events: list[Any],
) -> None:
    result = finished(tasks.flaky.enqueue(succeed_on=3))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3, "id": result.id}
    assert result.attempts == 3 == len(result.worker_ids)
    # The latest failed attempt's error is kept beside the success.
    assert result.errors[0].exception_class is ConnectionError
    assert [name for name, *_ in events] == [
        "enqueued",
        "started",
        "started",
        "started",
        "finished",
    ]

    spent = finished(tasks.flaky.enqueue(succeed_on=9))
    assert spent.status == TaskResultStatus.FAILED
    assert spent.attempts == 3
    assert "attempt 3 failed" in spent.errors[0].traceback


def test_a_task_that_raises_retry_after_is_ready_again_when_it_said(events: list[Any]) -> None:
    before = timezone.now()
    result = finished(tasks.throttled.enqueue())
    assert result.status == TaskResultStatus.READY
    run_after = task_backends["default"].get_result(result.id).task.run_after
    assert before + timedelta(seconds=599) <= run_after <= timezone.now() + timedelta(seconds=601)
    assert result.errors[0].exception_class is RetryAfter
    assert result.errors[0].traceback.endswith("RetryAfter: retry in 600s: 429 Too Many Requests\n")
    assert "finished" not in [name for name, *_ in events]  # a retry is no end
    JobRun.objects.filter(pk=run_id(result.id)).update(run_at=timezone.now())
    result = finished(result)
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        2,
        2,
    )


def test_a_value_that_is_not_json_fails_without_retries() -> None:
    result = finished(tasks.bad_return.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1  # its policy allows 5
    assert result.errors[0].exception_class is TypeError  # as Django's own backends say
    assert "Unsupported type" in result.errors[0].traceback


# Django's own tasks logger: Django 6's, or the backport's.
DJANGO_TASKS = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"


def test_a_failed_task_is_logged_once_with_its_exception(caplog: Any) -> None:
    """django_jobs' outcome lines, each with the exception; Django's own receivers
    write no line of their own for the runs' starts and end."""
    with caplog.at_level(logging.INFO):
        result = finished(tasks.flaky.enqueue(succeed_on=9))
    assert [r for r in caplog.records if r.name == DJANGO_TASKS] == []
    lines = [r for r in caplog.records if r.name == "django_jobs.execution"]
    assert [r.levelname for r in lines] == ["WARNING", "WARNING", "ERROR"]
    assert all(r.exc_info is not None for r in lines)
    assert "attempt 3 failed" in str(lines[-1].exc_info[1])  # type: ignore[index]
    assert f"run={run_id(result.id)} " in lines[-1].getMessage()


def test_task_finished_is_sent_while_the_exception_is_handled() -> None:
    """As Django's backends send it: a receiver reads the task's error in sys.exc_info()."""
    seen: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(sys.exc_info())

    task_finished.connect(receive)
    try:
        finished(tasks.flaky.enqueue(succeed_on=9))
    finally:
        task_finished.disconnect(receive)
    [(_, error, trace)] = seen
    assert "attempt 3 failed" in str(error)
    frames = "".join(traceback.format_tb(trace))
    assert "in flaky" in frames
    assert "_ended_handling" not in frames  # the raise that set exc_info is not shown


def test_an_end_django_jobs_logs_no_line_for_keeps_django_line(caplog: Any) -> None:
    """A pending task canceled: no worker logs its outcome; Django's receiver does."""
    result = tasks.add.enqueue(1, 2)
    with caplog.at_level(logging.INFO, logger=DJANGO_TASKS):
        cancel(run_id(result.id))
    [line] = [r for r in caplog.records if r.name == DJANGO_TASKS]
    assert result.id in line.getMessage()
    assert "state=FAILED" in line.getMessage()


def test_other_backends_task_lines_are_left_alone(caplog: Any) -> None:
    """Django's lines name a result id this backend did not sign: they are kept."""
    with caplog.at_level(logging.INFO, logger=DJANGO_TASKS):
        logging.getLogger(DJANGO_TASKS).info(
            "Task id=%s path=%s state=%s", "1", "elsewhere.task", TaskResultStatus.RUNNING
        )
    assert len([r for r in caplog.records if r.name == DJANGO_TASKS]) == 1


def test_return_values_are_normalised_as_django_does() -> None:
    assert finished(tasks.returns_bytes.enqueue()).return_value == "café"
    assert finished(tasks.returns_tuple.enqueue()).return_value == [1, 2, [3, 4]]


def test_async_task() -> None:
    result = finished(tasks.add_async.enqueue(20, 22))
    assert result.return_value == 42


def test_aenqueue_and_aget_result() -> None:
    result = async_to_sync(tasks.add.aenqueue)(4, 5)
    drain()
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 9)


def test_cancel_of_a_pending_task(events: list[Any]) -> None:
    result = tasks.add.enqueue(1, 1)
    assert cancel(run_id(result.id), reason="not needed") == 1
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is JobCanceled
    assert result.errors[0].traceback == "JobCanceled: not needed\n"
    assert drain() == 0
    assert events[-1][0::3] == ("finished", TaskResultStatus.FAILED)


def test_timeout_of_a_task() -> None:
    result = finished(tasks.too_slow.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert JobRun.objects.get(pk=run_id(result.id)).status == Status.TIMED_OUT
    assert result.errors[0].exception_class is JobTimeout


def test_rescue_of_a_task_whose_worker_died(events: list[Any]) -> None:
    result = tasks.add.enqueue(1, 2)
    dead = workers.register_worker("gone", 1, None, 1)
    assert len(claiming.claim_batch(dead.pk, None, 1)) == 1
    Worker.objects.filter(pk=dead.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert transitions.rescue_stale(None, 60) == (0, 1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.worker_ids == [str(dead.pk)]
    assert result.errors[0].exception_class is WorkerLost
    assert events[-1][0::3] == ("finished", TaskResultStatus.FAILED)


def test_task_finished_is_not_sent_for_a_run_retried_before_it(events: list[Any]) -> None:
    retried: list[int] = []

    def retry_once(sender: Any, run_id: int, **kwargs: Any) -> None:
        if not retried:
            retried.append(run_id)
            retry(run_id)

    run_failed.connect(retry_once)
    try:
        result = tasks.boom.enqueue("again")
        (claim,) = claiming.claim_batch(workers.register_worker("w", 1, None, 1).pk, None, 1)
        execute(claim)
    finally:
        run_failed.disconnect(retry_once)
    finished_events = [status for name, _, _, status in events if name == "finished"]
    assert finished_events == [TaskResultStatus.FAILED]
    result.refresh()
    assert result.status == TaskResultStatus.READY


def test_a_pool_name_with_a_percent_sign_is_claimed() -> None:
    result = tasks.add.using(queue_name="50%").enqueue(1, 2)
    worker = workers.register_worker("w", 1, ["50%"], 1)
    (claim,) = claiming.claim_batch(worker.pk, ["50%"], 1)
    assert claim.run_id == run_id(result.id)


def test_manual_retry_of_a_failed_task() -> None:
    result = finished(tasks.boom.enqueue("once"))
    run = retry(run_id(result.id))
    assert run.worker_ids == []
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.READY, 0)


def test_run_after_defers_the_run() -> None:
    later = timezone.now() + timedelta(minutes=5)
    result = tasks.add.using(run_after=later).enqueue(1, 2)
    assert drain() == 0
    assert JobRun.objects.get(pk=run_id(result.id)).run_at == later
    assert result.task.run_after == later
    assert tasks.add.get_result(result.id) == result


def test_priority_orders_the_runs(events: list[Any]) -> None:
    low = tasks.add.using(priority=-10).enqueue(0, 0)
    high = tasks.add.using(priority=10).enqueue(0, 0)
    runs = JobRun.objects.filter(pk__in=[run_id(low.id), run_id(high.id)])
    assert dict(runs.values_list("id", "priority")) == {run_id(low.id): -10, run_id(high.id): 10}
    drain()
    started = [result_id for name, _, result_id, _ in events if name == "started"]
    assert started == [high.id, low.id]


def test_concurrency_key_from_the_tasks_arguments() -> None:
    result = tasks.debit.enqueue(7, amount=100)
    assert JobRun.objects.get(pk=run_id(result.id)).concurrency_key == "account:7"


def test_a_tasks_concurrency_limit_is_its_runs() -> None:
    limited = task(concurrency_key="partner", concurrency_limit=4)(tasks.add.func)
    result = limited.enqueue(1, 2)
    stored = JobRun.objects.get(pk=run_id(result.id))
    assert (stored.concurrency_key, stored.concurrency_limit) == ("partner", 4)


def test_get_result_of_what_is_not_a_task_run() -> None:
    job_run = start("tests.noop")
    real = tasks.add.enqueue(1, 1).id
    assert tasks.add.get_result(real).id == real
    number, _, signature = real.partition(":")
    for result_id in [
        str(job_run.pk),
        number,  # a bare run id
        "nope",
        "-1",
        "9" * 30,
        f"0{real}",
        f"{number}:{signature[:-1]}",
        f"{number}:",
        f"{number}:{signature}:{signature}",
    ]:
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add.get_result(result_id)


def test_a_result_id_cannot_be_guessed_from_another() -> None:
    """Sequential run ids made get_result(str(int(id) - 1)) read the caller before."""
    theirs = tasks.add.enqueue(1, 1)
    mine = tasks.add.enqueue(2, 2)
    assert run_id(mine.id) == run_id(theirs.id) + 1
    signature = mine.id.partition(":")[2]
    for forged in (str(run_id(theirs.id)), f"{run_id(theirs.id)}:{signature}"):
        with pytest.raises(TaskResultDoesNotExist) as missing:
            tasks.add.get_result(forged)
        assert missing.value.args == (forged,)  # exactly as for a missing result
    assert tasks.add.get_result(theirs.id).args == [1, 1]  # its holder still reads it


def test_result_ids_survive_a_secret_key_rotation_with_fallbacks() -> None:
    result = tasks.add.enqueue(1, 1)
    rotated = {"SECRET_KEY": "a-new-key-" * 5, "SECRET_KEY_FALLBACKS": [settings.SECRET_KEY]}
    with override_settings(**rotated):
        found = tasks.add.get_result(result.id)
        assert run_id(found.id) == run_id(result.id)  # signed with the new key from now on
    forgotten = {"SECRET_KEY": "a-new-key-" * 5, "SECRET_KEY_FALLBACKS": []}
    with override_settings(**forgotten), pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


def test_task_options_are_validated() -> None:
    with pytest.raises(InvalidTask, match="retry must be a RetryPolicy"):
        task(retry=3)(tasks.add.func)
    with pytest.raises(InvalidTask, match="timeout must be positive"):
        task(timeout=-1)(tasks.add.func)
    with pytest.raises(InvalidTask, match="concurrency_key must be"):
        task(concurrency_key=3)(tasks.add.func)
    with pytest.raises(InvalidTask, match="concurrency_limit must be between 1 and 1000"):
        task(concurrency_key="k", concurrency_limit=0)(tasks.add.func)
    with pytest.raises(InvalidTask, match=r"queue_name 'x{101}' is longer"):
        tasks.add.using(queue_name="x" * 101)
    configured = task(retry=RetryPolicy(attempts=4), timeout=timedelta(seconds=3))(tasks.add.func)
    assert configured.retry == RetryPolicy(attempts=4)
    assert JobRun.objects.count() == 0


def test_input_that_is_not_json_is_refused_and_nothing_is_written() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(timezone.now(), 1)
    assert JobRun.objects.count() == 0


def test_checks() -> None:
    assert task_backends["default"].check() == []
    with override_settings(
        TASKS={"default": {"BACKEND": JOBS, "QUEUES": ["ok", ""], "OPTIONS": {"x": 1}}}
    ):
        ids = [message.id for message in task_backends["default"].check()]
    assert ids == ["django_jobs.E007", "django_jobs.E008"]


def test_check_without_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.apps import apps

    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_jobs")
    assert [message.id for message in task_backends["default"].check()] == ["django_jobs.E006"]


def test_every_run_status_has_a_task_status() -> None:
    # Keyed by value: the backend does not import the models at module level.
    from django_jobs.tasks_backend import STATUSES

    assert set(STATUSES) == set(Status.values)


def test_the_backends_flags() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, JobsBackend)
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task
