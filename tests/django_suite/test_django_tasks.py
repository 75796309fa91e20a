"""Django's own tests of its tasks framework (``tests/tasks/``), run against JobsBackend.

Django's test cases are subclassed with ``TASKS`` pointing at JobsBackend, and
a database (their ``SimpleTestCase`` has none). A test that holds as written
is inherited unchanged. A test that relies on the dummy or immediate backend's
internals (its in-memory ``results`` list, a task that has already run when
``enqueue()`` returns) is overridden here, with the reason above it: the
django_jobs way is enqueue, then drain the worker, then refresh.

``counts()`` tells how many run unchanged and how many are adapted (the test
run prints it). The Django sdist is fetched by ``fetch.py``.
"""

from __future__ import annotations

import importlib
import sys
from datetime import timedelta
from typing import Any

import django
import pytest

if django.VERSION < (6, 0):
    pytest.skip(
        "Django's tests/tasks ships with Django 6.0 and later; on Django 5.2 the "
        "backport shim is covered by tests/integration/test_tasks_backend.py",
        allow_module_level=True,
    )

from asgiref.sync import sync_to_async
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import (
    InvalidTask,
    TaskResultDoesNotExist,
)
from django.test import TestCase, override_settings
from django.utils import timezone

from django_jobs.models import JobRun
from django_jobs.tasks_backend import JobsBackend, run_id
from django_jobs.testing import drain
from tests.django_suite.fetch import django_tests_dir

sys.path.insert(0, str(django_tests_dir()))
# Modules, not classes, are imported: pytest would otherwise collect Django's own
# classes too, against their own backends.
django_tasks = importlib.import_module("tasks.tasks")
django_test_tasks = importlib.import_module("tasks.test_tasks")
django_test_dummy = importlib.import_module("tasks.test_dummy_backend")
django_test_immediate = importlib.import_module("tasks.test_immediate_backend")
django_test_custom = importlib.import_module("tasks.test_custom_backend")

JOBS = "django_jobs.tasks_backend.JobsBackend"
# A task's outcome is logged by django_jobs, on this logger, once per attempt;
# Django's receivers write no line of their own for the run's start and end
# (docs/decisions.md): the tests of Django's log lines expect django_jobs' instead.
OUTCOMES = "django_jobs.execution"
ONLY_QUEUE_1 = override_settings(TASKS={"default": {"BACKEND": JOBS, "QUEUES": ["queue-1"]}})
UNKNOWN_QUEUE = "Queue 'unknown_queue' is not valid"


def finished(result: Any) -> Any:
    """Run what is due on django_jobs (as a worker would), then reload ``result``."""
    drain()
    result.refresh()
    return result


class _WithoutClear:
    # DummyBackend keeps results in a list that setUp() clears; django_jobs keeps
    # them in the database, which each test's transaction rolls back.
    def setUp(self) -> None:
        pass


class _ValidatesOnJobsBackend:
    """test_validate_on_enqueue / _aenqueue of the dummy and immediate test cases.

    Django's overrode TASKS with the dummy or immediate backend itself: the
    same check, on JobsBackend.
    """

    assertRaisesMessage: Any

    def test_validate_on_enqueue(self) -> None:
        task = django_tasks.noop_task.using(queue_name="unknown_queue")
        with ONLY_QUEUE_1, self.assertRaisesMessage(InvalidTask, UNKNOWN_QUEUE):
            task.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        task = django_tasks.noop_task.using(queue_name="unknown_queue")
        with ONLY_QUEUE_1, self.assertRaisesMessage(InvalidTask, UNKNOWN_QUEUE):
            await task.aenqueue()


@override_settings(
    TASKS={
        "default": {"BACKEND": JOBS, "QUEUES": ["default", "queue_1"]},
        "immediate": {
            "BACKEND": "django.tasks.backends.immediate.ImmediateBackend",
            "QUEUES": [],
        },
        "missing": {"BACKEND": "does.not.exist"},
    }
)
class JobsTaskTestCase(_WithoutClear, TestCase, django_test_tasks.TaskTestCase):
    """test_tasks.py: the framework's own behaviour, with JobsBackend as the default."""

    # Asserted DummyBackend; the default backend is JobsBackend here.
    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], JobsBackend)

    # Read DummyBackend's in-memory results; here the run is in the database.
    def test_enqueue_task(self) -> None:
        result = django_tasks.noop_task.enqueue()
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.task, django_tasks.noop_task)
        self.assertEqual((result.args, result.kwargs), ([], {}))
        self.assertEqual(default_task_backend.get_result(result.id), result)

    # As above, through aenqueue().
    async def test_enqueue_task_async(self) -> None:
        result = await django_tasks.noop_task.aenqueue()
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.task, django_tasks.noop_task)
        self.assertEqual(await default_task_backend.aget_result(result.id), result)

    # refresh() reads the database, which an async test must do through
    # sync_to_async (DummyBackend's refresh() reads a list).
    async def test_refresh_result(self) -> None:
        import dataclasses

        result = await django_tasks.noop_task.aenqueue()
        original = dataclasses.asdict(result)
        await sync_to_async(result.refresh)()
        self.assertEqual(dataclasses.asdict(result), original)
        await result.arefresh()
        self.assertEqual(dataclasses.asdict(result), original)

    # The sync get_result() reads the database, which Django refuses in an
    # async context; the sync half runs through sync_to_async.
    async def test_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            await sync_to_async(django_tasks.noop_task.get_result)("123")
        with self.assertRaises(TaskResultDoesNotExist):
            await django_tasks.noop_task.aget_result("123")

    # Asserted DummyBackend as the default.
    def test_get_backend(self) -> None:
        self.assertIsInstance(django_tasks.noop_task.get_backend(), JobsBackend)
        immediate_task = django_tasks.noop_task.using(backend="immediate")
        self.assertIsInstance(immediate_task.get_backend(), type(task_backends["immediate"]))


@override_settings(TASKS={"default": {"BACKEND": JOBS, "QUEUES": []}})
class JobsAsDummyTestCase(
    _WithoutClear, _ValidatesOnJobsBackend, TestCase, django_test_dummy.DummyBackendTestCase
):
    """test_dummy_backend.py: what an enqueue-only backend promises until a worker runs."""

    # Asserted the class.
    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], JobsBackend)
        self.assertEqual(
            (default_task_backend.alias, default_task_backend.options), ("default", {})
        )

    # Checked membership of DummyBackend's results list; here, the stored run.
    def test_enqueue_task(self) -> None:
        for task in [django_tasks.noop_task, django_tasks.noop_task_async]:
            with self.subTest(task):
                result = task.enqueue(1, two=3)
                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertIs(result.is_finished, False)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value
                self.assertEqual((result.task, result.args, result.kwargs), (task, [1], {"two": 3}))
                self.assertEqual(result.attempts, 0)
                self.assertEqual(default_task_backend.get_result(result.id), result)

    # As above, through aenqueue().
    async def test_enqueue_task_async(self) -> None:
        for task in [django_tasks.noop_task, django_tasks.noop_task_async]:
            with self.subTest(task):
                result = await task.aenqueue()
                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertIsNone(result.started_at)
                self.assertEqual(result.attempts, 0)
                self.assertEqual(await default_task_backend.aget_result(result.id), result)

    # Changed the stored result by hand; here a worker runs it: enqueue, drain, refresh.
    def test_refresh_result(self) -> None:
        result = default_task_backend.enqueue(django_tasks.calculate_meaning_of_life, (), {})
        self.assertEqual(result.status, TaskResultStatus.READY)
        finished(result)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    # As above, in an async test.
    async def test_refresh_result_async(self) -> None:
        result = await default_task_backend.aenqueue(django_tasks.calculate_meaning_of_life, (), {})
        self.assertEqual(result.status, TaskResultStatus.READY)
        await sync_to_async(drain)()
        await result.arefresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    # The sync get_result() in an async test, as in JobsTaskTestCase.
    async def test_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            await sync_to_async(default_task_backend.get_result)("123")
        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("123")

    # DummyBackend.clear() empties its list; a stored run goes when it is deleted.
    def test_clear(self) -> None:
        result = django_tasks.noop_task.enqueue()
        default_task_backend.get_result(result.id)
        JobRun.objects.filter(pk=run_id(result.id)).delete()
        with self.assertRaisesMessage(TaskResultDoesNotExist, result.id):
            default_task_backend.get_result(result.id)


@override_settings(TASKS={"default": {"BACKEND": JOBS, "QUEUES": []}})
class JobsAsImmediateTestCase(
    _ValidatesOnJobsBackend, TestCase, django_test_immediate.ImmediateBackendTestCase
):
    """test_immediate_backend.py: what running a task records, once a worker ran it."""

    # Asserted the class.
    def test_using_correct_backend(self) -> None:
        self.assertIsInstance(task_backends["default"], JobsBackend)
        self.assertEqual(
            (default_task_backend.alias, default_task_backend.options), ("default", {})
        )

    # The task ran inside enqueue(); here: enqueue, drain, refresh.
    def test_enqueue_task(self) -> None:
        for task in [django_tasks.noop_task, django_tasks.noop_task_async]:
            with self.subTest(task):
                result = finished(task.enqueue(1, two=3))
                self.assert_successful(result, task, [1], {"two": 3})

    # As above, through aenqueue().
    async def test_enqueue_task_async(self) -> None:
        for task in [django_tasks.noop_task, django_tasks.noop_task_async]:
            with self.subTest(task):
                result = await task.aenqueue()
                await sync_to_async(drain)()
                await result.arefresh()
                self.assert_successful(result, task, [], {})

    def assert_successful(self, result: Any, task: Any, args: Any, kwargs: Any) -> None:
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertIs(result.is_finished, True)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)
        self.assertEqual(result.last_attempted_at, result.started_at)
        self.assertIsNone(result.return_value)
        self.assertEqual((result.task, result.args, result.kwargs), (task, args, kwargs))
        self.assertEqual(result.attempts, 1)

    # Enqueue, drain, refresh. SystemExit fails the run as under ImmediateBackend
    # (it never stops a worker). Its line is django_jobs' (OUTCOMES).
    def test_catches_exception(self) -> None:
        cases = [
            (
                django_tasks.failing_task_value_error,
                ValueError,
                "This Task failed due to ValueError",
            ),
            (
                django_tasks.failing_task_system_exit,
                SystemExit,
                "This Task failed due to SystemExit",
            ),
        ]
        for task, exception, message in cases:
            with self.subTest(task), self.assertLogs(OUTCOMES, level="ERROR") as logs:
                result = finished(task.enqueue())
                self.assertEqual(len(logs.output), 1)
                self.assertIn(message, logs.output[0])
            self.assertEqual(result.status, TaskResultStatus.FAILED)
            with self.assertRaisesMessage(ValueError, "Task failed"):
                result.return_value
            self.assertIs(result.is_finished, True)
            self.assertGreaterEqual(result.started_at, result.enqueued_at)
            self.assertGreaterEqual(result.finished_at, result.started_at)
            self.assertEqual(result.errors[0].exception_class, exception)
            self.assertTrue(
                result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
            )
            self.assertEqual((result.task, result.args, result.kwargs), (task, [], {}))

    # ImmediateBackend lets KeyboardInterrupt through to the caller of enqueue();
    # a worker running the task records it as the task's failure instead (a
    # handler's BaseException ends its run, never the worker). Logged by django_jobs.
    def test_throws_keyboard_interrupt(self) -> None:
        with self.assertLogs(OUTCOMES, level="ERROR"):
            result = finished(
                default_task_backend.enqueue(django_tasks.failing_task_keyboard_interrupt, [], {})
            )
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, KeyboardInterrupt)

    # Enqueue, drain, refresh; logged by django_jobs.
    def test_complex_exception(self) -> None:
        with self.assertLogs(OUTCOMES, level="ERROR"):
            result = finished(django_tasks.complex_exception.enqueue())
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn('ValueError(ValueError("This task failed"))', result.errors[0].traceback)

    # Enqueue, drain, refresh; logged by django_jobs.
    def test_complex_return_value(self) -> None:
        with self.assertLogs(OUTCOMES, level="ERROR"):
            result = finished(django_tasks.complex_return_value.enqueue())
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)
        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, TypeError)
        self.assertIn("Unsupported type", result.errors[0].traceback)

    # Enqueue, drain, refresh.
    def test_result(self) -> None:
        result = finished(
            default_task_backend.enqueue(django_tasks.calculate_meaning_of_life, [], {})
        )
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    # As above, in an async test.
    async def test_result_async(self) -> None:
        result = await default_task_backend.aenqueue(django_tasks.calculate_meaning_of_life, [], {})
        await sync_to_async(drain)()
        await result.arefresh()
        self.assertEqual(result.return_value, 42)

    # ImmediateBackend cannot fetch results; JobsBackend can, from any process.
    async def test_cannot_get_result(self) -> None:
        result = await default_task_backend.aenqueue(django_tasks.noop_task, (), {})
        self.assertEqual(await default_task_backend.aget_result(result.id), result)
        self.assertEqual(await sync_to_async(default_task_backend.get_result)(result.id), result)

    # As above, for refresh().
    async def test_cannot_refresh_result(self) -> None:
        result = await default_task_backend.aenqueue(django_tasks.calculate_meaning_of_life, (), {})
        await sync_to_async(drain)()
        await result.arefresh()
        self.assertEqual(result.return_value, 42)

    # ImmediateBackend refuses run_after; JobsBackend defers the run to it.
    def test_cannot_pass_run_after(self) -> None:
        later = timezone.now() + timedelta(hours=1)
        task = django_tasks.calculate_meaning_of_life.using(run_after=later)
        default_task_backend.validate_task(task)
        result = task.enqueue()
        self.assertEqual(drain(), 0)
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.task.run_after, later)

    # Enqueue, drain, refresh. Django's line of the enqueue is there; the run's
    # outcome (Django's RUNNING and SUCCESSFUL lines) is django_jobs' one line.
    def test_enqueue_logs(self) -> None:
        with (
            self.assertLogs("django.tasks", level="DEBUG") as logs,
            self.assertLogs(OUTCOMES, level="DEBUG") as outcomes,
        ):
            result = finished(django_tasks.noop_task.enqueue())
        self.assertEqual(len(logs.output), 1)
        self.assertIn("enqueued", logs.output[0])
        self.assertIn(result.id, logs.output[0])
        self.assertEqual(len(outcomes.output), 1)
        self.assertIn(f"run={run_id(result.id)} ", outcomes.output[0])
        self.assertIn("outcome=completed", outcomes.output[0])

    # As above, for a failing task.
    def test_failed_logs(self) -> None:
        with (
            self.assertLogs("django.tasks", level="DEBUG") as logs,
            self.assertLogs(OUTCOMES, level="DEBUG") as outcomes,
        ):
            result = finished(django_tasks.failing_task_value_error.enqueue())
        self.assertEqual(len(logs.output), 1)
        self.assertEqual(len(outcomes.output), 1)
        self.assertIn(f"run={run_id(result.id)} ", outcomes.output[0])
        self.assertIn("outcome=failed", outcomes.output[0])

    # Enqueue, drain, refresh.
    def test_successful_task_no_none_in_logs(self) -> None:
        with self.assertLogs("django.tasks", level="DEBUG") as logs:
            result = finished(django_tasks.noop_task.enqueue())
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        for line in logs.output:
            self.assertNotIn("None", line)

    # Enqueue, drain, refresh.
    def test_takes_context(self) -> None:
        result = finished(django_tasks.get_task_id.enqueue())
        self.assertEqual(result.return_value, result.id)

    # Enqueue, drain, refresh; the context's attempt is django_jobs' attempt.
    def test_context(self) -> None:
        result = finished(django_tasks.test_context.enqueue(1))
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)


class JobsAsImmediateTransactionTestCase(django_test_immediate.ImmediateBackendTransactionTestCase):
    # Django's flushes only the tables of available_apps ([] there); a run is a row.
    available_apps = ["django_jobs"]

    # ImmediateBackend ran the task inside enqueue(); JobsBackend inserts its run
    # in the caller's transaction, and a worker runs it once that commits.
    @override_settings(TASKS={"default": {"BACKEND": JOBS}})
    def test_doesnt_wait_until_transaction_commit_by_default(self) -> None:
        with transaction.atomic():
            result = django_tasks.noop_task.enqueue()
            self.assertIsNotNone(result.enqueued_at)
            self.assertEqual(result.status, TaskResultStatus.READY)
        finished(result)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)


class JobsAsDummyTransactionTestCase(django_test_dummy.DummyBackendTransactionTestCase):
    available_apps = ["django_jobs"]  # as above

    # Counted DummyBackend's results list; here the run is a row of the caller's
    # transaction: there inside it, and gone if it rolls back.
    @override_settings(TASKS={"default": {"BACKEND": JOBS}})
    def test_doesnt_wait_until_transaction_commit_by_default(self) -> None:
        with transaction.atomic():
            result = django_tasks.noop_task.enqueue()
            self.assertIsNotNone(result.enqueued_at)
            self.assertEqual(default_task_backend.get_result(result.id), result)
        self.assertEqual(default_task_backend.get_result(result.id), result)
        with self.assertRaises(ZeroDivisionError), transaction.atomic():
            rolled_back = django_tasks.noop_task.enqueue()
            1 / 0
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result(rolled_back.id)


@override_settings(
    TASKS={"default": {"BACKEND": JOBS, "QUEUES": []}},
    DJANGO_JOBS={"RUN_ON_COMMIT": True},
)
class JobsInTestModeAsImmediateTestCase(
    _ValidatesOnJobsBackend, TestCase, django_test_immediate.ImmediateBackendTestCase
):
    """test_immediate_backend.py on the test mode (``RUN_ON_COMMIT``): as written for
    ImmediateBackend, enqueue() has run the task when it returns."""

    # Asserted the class.
    def test_using_correct_backend(self) -> None:
        self.assertIsInstance(task_backends["default"], JobsBackend)

    # ImmediateBackend lets KeyboardInterrupt through to the caller of enqueue(); the
    # test mode runs the task as a worker does, which records it as the task's failure.
    def test_throws_keyboard_interrupt(self) -> None:
        with self.assertLogs("django.tasks", level="ERROR"):
            result = default_task_backend.enqueue(
                django_tasks.failing_task_keyboard_interrupt, [], {}
            )
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, KeyboardInterrupt)

    # ImmediateBackend cannot fetch results; JobsBackend can.
    async def test_cannot_get_result(self) -> None:
        result = await default_task_backend.aenqueue(django_tasks.calculate_meaning_of_life, (), {})
        fetched = await default_task_backend.aget_result(result.id)
        self.assertEqual(fetched.return_value, 42)

    # As above, for refresh().
    async def test_cannot_refresh_result(self) -> None:
        result = await default_task_backend.aenqueue(django_tasks.calculate_meaning_of_life, (), {})
        await result.arefresh()
        self.assertEqual(result.return_value, 42)

    # ImmediateBackend refuses run_after; JobsBackend defers the run to it, and the
    # test mode does not wait for it.
    def test_cannot_pass_run_after(self) -> None:
        later = timezone.now() + timedelta(hours=1)
        result = django_tasks.calculate_meaning_of_life.using(run_after=later).enqueue()
        self.assertEqual(result.status, TaskResultStatus.READY)


class JobsInTestModeAsImmediateTransactionTestCase(
    django_test_immediate.ImmediateBackendTransactionTestCase
):
    """Unchanged but for the backend: the task has run when the block commits."""

    available_apps = ["django_jobs"]

    # ImmediateBackend ran the task inside enqueue(), inside the block; the test
    # mode runs it when the block commits.
    @override_settings(TASKS={"default": {"BACKEND": JOBS}}, DJANGO_JOBS={"RUN_ON_COMMIT": True})
    def test_doesnt_wait_until_transaction_commit_by_default(self) -> None:
        with transaction.atomic():
            result = django_tasks.noop_task.enqueue()
            self.assertIsNotNone(result.enqueued_at)
            self.assertEqual(result.status, TaskResultStatus.READY)
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)


class CustomBackendTestCase(django_test_custom.CustomBackendTestCase):
    """test_custom_backend.py, unchanged: the framework with other backends alongside."""


class CustomTaskTestCase(django_test_custom.CustomTaskTestCase):
    """Unchanged: a backend's own Task class, as JobsTask is."""


SUITE = [
    JobsTaskTestCase,
    JobsAsDummyTestCase,
    JobsAsImmediateTestCase,
    JobsAsImmediateTransactionTestCase,
    JobsInTestModeAsImmediateTestCase,
    JobsInTestModeAsImmediateTransactionTestCase,
    JobsAsDummyTransactionTestCase,
    CustomBackendTestCase,
    CustomTaskTestCase,
]


def counts() -> tuple[int, int]:
    """How many of Django's tests run here unchanged, and how many are adapted."""
    unchanged = adapted = 0
    for case in SUITE:
        django_case = next(c for c in case.__mro__ if c.__module__.startswith("tasks."))
        names = {name for name in dir(django_case) if name.startswith("test")}
        overridden = {name for name in names if getattr(case, name) != getattr(django_case, name)}
        adapted += len(overridden)
        unchanged += len(names - overridden)
    return unchanged, adapted
