"""The test mode: DJANGO_JOBS["RUN_ON_COMMIT"] runs what a start made due in the starting
process, when the caller's transaction commits (at once outside one).

Most tests run inside a TestCase-style transaction (``django_db``), as users' tests
do; the commit tests run with real transactions (``transaction=True``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.test import override_settings

from django_jobs import cancel, retry, send_event, start, start_many
from django_jobs.api import run_now
from django_jobs.exceptions import RunFailed
from django_jobs.models import JobRun, Status
from django_jobs.tasks_compat import (
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.testapp import tasks
from tests.testapp.models import Execution

ON = {"RUN_ON_COMMIT": True}


@pytest.fixture(autouse=True)
def test_mode() -> Iterator[None]:
    with override_settings(DJANGO_JOBS=ON):
        yield


def ran(job_type: str) -> int:
    return Execution.objects.filter(job_type=job_type).count()


@transaction.atomic
def start_then_roll_back(job_type: str) -> None:
    start(job_type, {})
    raise RuntimeError("rolled back")


@pytest.mark.django_db
def test_a_start_outside_the_callers_transactions_runs_at_once() -> None:
    run = start("tests.echo", {"x": 1})
    # The caller's object holds the row as the run left it.
    assert run.status == Status.COMPLETED
    assert run.output == {"x": 1}
    assert run.wait() == {"x": 1}


@pytest.mark.django_db
def test_a_start_inside_a_block_runs_when_the_block_exits() -> None:
    with transaction.atomic():
        run = start("tests.record", {"tag": "inside"})
        assert run.status == Status.PENDING
        assert JobRun.objects.get(pk=run.pk).status == Status.PENDING
        with transaction.atomic():
            # A nested block's exit is not the caller's commit.
            start("tests.record", {"tag": "nested"})
        assert JobRun.objects.filter(status=Status.COMPLETED).count() == 0
    assert run.status == Status.COMPLETED
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 2


@pytest.mark.django_db
def test_a_block_that_rolls_back_runs_nothing() -> None:
    with pytest.raises(RuntimeError):
        start_then_roll_back("tests.record")
    assert not JobRun.objects.exists()
    assert ran("tests.record") == 0
    # The next block that commits runs its own runs only.
    with transaction.atomic():
        run = start("tests.echo", {"n": 2})
    assert run.status == Status.COMPLETED
    assert JobRun.objects.count() == 1


@pytest.mark.django_db
def test_a_block_without_a_savepoint_runs_at_once() -> None:
    # atomic(savepoint=False) inside a test's transaction has no exit of its own
    # to wait for: the runs run at the start.
    with transaction.atomic(savepoint=False):
        run = start("tests.echo", {"n": 3})
        assert run.status == Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_with_real_transactions_a_run_runs_at_the_commit() -> None:
    with transaction.atomic():
        run = start("tests.echo", {"n": 1})
        assert run.status == Status.PENDING
    assert run.status == Status.COMPLETED
    with pytest.raises(RuntimeError):
        start_then_roll_back("tests.echo")
    assert JobRun.objects.count() == 1
    # In autocommit, at once.
    assert start("tests.echo", {"n": 3}).status == Status.COMPLETED


@pytest.mark.django_db
def test_children_and_waits_are_resolved_in_the_same_drain() -> None:
    run = start("tests.parent", {"n": 3})
    assert run.status == Status.COMPLETED
    assert run.output["outputs"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert JobRun.objects.filter(parent=run, status=Status.COMPLETED).count() == 3


@pytest.mark.django_db
def test_retries_without_a_backoff_run_and_failures_are_visible() -> None:
    flaky = start("tests.flaky", {"succeed_on": 3})
    assert flaky.status == Status.COMPLETED
    assert flaky.attempts == 3
    failed = start("tests.permanent", {})
    assert failed.status == Status.FAILED
    assert failed.error["message"] == "this will never work"
    with pytest.raises(RunFailed):
        failed.wait()


@pytest.mark.django_db
def test_a_backoff_is_not_waited_for() -> None:
    run = start("tests.backoff", {})
    assert run.status == Status.PENDING
    assert run.attempts == 1


@pytest.mark.django_db
def test_start_many_retry_run_now_and_cancel_run_what_they_made_due() -> None:
    runs = start_many("tests.echo", [{"i": i} for i in range(5)])
    assert [run.status for run in runs] == [Status.COMPLETED] * 5
    failed = start("tests.permanent", {})
    assert failed.status == Status.FAILED
    again = retry(failed.pk)
    assert again.status == Status.FAILED
    assert again.attempts == 1
    later = start("tests.echo", {"late": True}, delay=3600)
    assert later.status == Status.PENDING
    assert run_now(later.pk)
    later.refresh_from_db()
    assert later.status == Status.COMPLETED
    # A parent waiting for a child that cannot run (its pool's runs are not due):
    # canceling the child wakes the parent, which runs at once.
    parent = start("tests.parent", {"n": 1, "child": "tests.backoff"})
    assert parent.status == Status.WAITING
    child = JobRun.objects.get(parent=parent)
    assert child.status == Status.PENDING  # its retry is an hour away
    assert cancel(child.pk) == 1
    parent.refresh_from_db()
    assert parent.status == Status.FAILED  # wait_for raised: its child was canceled


@pytest.mark.django_db
def test_an_event_resumes_its_run() -> None:
    run = start("tests.approval", {"event": "approved"})
    assert run.status == Status.WAITING
    send_event(run, "approved", {"by": "ana"})
    assert run.status == Status.COMPLETED
    assert run.output == [{"by": "ana"}]


@pytest.mark.django_db
def test_a_start_inside_a_handler_runs_in_the_same_drain() -> None:
    # tests.parent's children are started inside its handler: no drain nests in it.
    run = start("tests.parent", {"n": 1, "child": "tests.parent"})
    assert run.status == Status.COMPLETED
    # The child is a parent of two echoes in turn.
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 4


@pytest.mark.django_db
def test_off_by_default() -> None:
    with override_settings(DJANGO_JOBS={}):
        run = start("tests.echo", {})
    assert run.status == Status.PENDING


@pytest.mark.django_db(transaction=True)
def test_astart_runs_at_once() -> None:
    from django_jobs import astart

    run = async_to_sync(astart)("tests.async_echo", {"a": 1})
    assert run.status == Status.COMPLETED
    assert run.output == {"a": 1}


# --- the tasks backend, against a test written for Django's immediate backend ---------

IMMEDIATE = (
    "django.tasks.backends.immediate.ImmediateBackend"
    if django.VERSION >= (6, 0)
    else "django_tasks.backends.immediate.ImmediateBackend"
)


def immediate_backend_test() -> list[Any]:
    """A test as one writes it for Django's ImmediateBackend: ``enqueue()`` has run
    the task. Returns what it observed, to compare between backends."""
    seen: list[Any] = []

    def receive(signal: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((signal, task_result.status))

        return receiver

    receivers = [
        (task_enqueued, receive("enqueued")),
        (task_started, receive("started")),
        (task_finished, receive("finished")),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        result = tasks.add.enqueue(2, 3)
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 5
        seen.append(("add", result.return_value))
        failed = tasks.boom.enqueue("no")
        assert failed.status == TaskResultStatus.FAILED
        seen.append(("boom", failed.errors[0].exception_class_path))
        async_result = tasks.add_async.enqueue(1, 1)
        seen.append(("add_async", async_result.status, async_result.return_value))
        noted = Execution.objects.filter(job_type="inside a block")
        before = noted.count()
        with transaction.atomic():
            tasks.note.enqueue("inside a block")
        seen.append(("noted", noted.count() - before))
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    return seen


@pytest.mark.django_db
def test_a_test_written_for_the_immediate_backend_passes_on_test_mode() -> None:
    with override_settings(TASKS={"default": {"BACKEND": IMMEDIATE}}):
        expected = immediate_backend_test()
    with override_settings(TASKS={"default": {"BACKEND": "django_jobs.tasks_backend.JobsBackend"}}):
        observed = immediate_backend_test()
    assert observed == expected
    assert ("enqueued", TaskResultStatus.READY) in observed


@pytest.mark.django_db(transaction=True)
def test_a_transaction_managed_by_hand_runs_at_once() -> None:
    transaction.set_autocommit(False)
    try:
        run = start("tests.echo", {"n": 1})
        assert run.status == Status.COMPLETED
        transaction.commit()
    finally:
        transaction.set_autocommit(True)


@pytest.mark.django_db
def test_capturing_on_commit_callbacks_drains_once(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with transaction.atomic():
        with django_capture_on_commit_callbacks(execute=True):
            run = start("tests.record", {})
        assert run.status == Status.COMPLETED
    assert ran("tests.record") == 1
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 1


@pytest.mark.django_db
def test_a_drain_of_one_pool_runs_what_its_handlers_start_elsewhere() -> None:
    from django_jobs.testing import drain

    with override_settings(DJANGO_JOBS={}):
        parent = start("tests.parent", {"n": 1}, pool="parents")
    # tests.echo's pool is "echo": drained after the parents' pool, in test mode.
    drain("parents")
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED


@pytest.mark.django_db
def test_resuming_a_pool_runs_its_runs() -> None:
    from django_jobs.pools import pause_pool, resume_pool

    pause_pool("echo")
    run = start("tests.echo", {})
    assert run.status == Status.PENDING
    resume_pool("echo")
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
