"""A third-party app's ``@task`` code on JobsBackend, as it is: modelsearch.

modelsearch (Wagtail's search indexing, a package of its own) imports ``task``
from the django-tasks backport, as Wagtail does, and enqueues
``insert_or_update_object_task`` when an indexed model is saved
(``tests.searchapp.Article``). On Django 6 the backport's decorator builds the
task with the backend's task class, ``JobsTask``, a ``django.tasks.Task``: the
backend and its workers take it like any task of ``django.tasks``.
"""

from __future__ import annotations

from collections.abc import Callable

import django
import pytest
from django.db import connection, transaction
from django.test import override_settings
from modelsearch.backends import get_search_backend
from modelsearch.tasks import insert_or_update_object_task

from django_jobs.models import JobRun, Status
from django_jobs.tasks_backend import TASK_SOURCE, JobsTask
from tests.helpers import WorkerProcess
from tests.searchapp.models import Article

StartWorker = Callable[..., WorkerProcess]
TASK = "modelsearch.tasks.insert_or_update_object_task"
JOBS = "django_jobs.tasks_backend.JobsBackend"
IMMEDIATE = (
    "django.tasks.backends.immediate.ImmediateBackend"
    if django.VERSION >= (6, 0)
    else "django_tasks.backends.immediate.ImmediateBackend"
)


def found(words: str) -> list[str]:
    """The titles of the articles modelsearch's index finds for ``words``."""
    return sorted(article.title for article in get_search_backend().search(words, Article))


def test_the_backports_decorator_builds_the_backends_task_class() -> None:
    # Django 6.1 too: the backport's @task asks TASKS' backend for its task class.
    assert isinstance(insert_or_update_object_task, JobsTask)
    assert insert_or_update_object_task.module_path == TASK


@pytest.mark.django_db(transaction=True)
@pytest.mark.process
def test_a_worker_runs_the_apps_task_as_it_is(start_worker: StartWorker) -> None:
    with transaction.atomic():
        article = Article.objects.create(title="Durable lighthouse", body="keepers")
    Article.objects.create(title="Ephemeral harbour")
    runs = JobRun.objects.filter(job_type=TASK)
    assert runs.count() == 2
    run = runs.get(input__args=["searchapp", "article", str(article.pk)])
    assert (run.status, run.pool, run.trigger_source) == (Status.PENDING, "default", TASK_SOURCE)
    assert found("lighthouse") == []  # enqueued, not run: a worker's job

    worker = start_worker("--pool", "default", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert sorted(runs.values_list("status", flat=True)) == [Status.COMPLETED] * 2
    assert found("lighthouse") == ["Durable lighthouse"]
    assert found("keepers harbour") == []

    article.title = "Durable beacon"
    article.save()
    worker = start_worker("--pool", "default", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert runs.filter(status=Status.COMPLETED).count() == 3
    assert found("beacon") == ["Durable beacon"]
    assert found("lighthouse") == []


def a_test_written_for_the_immediate_backend() -> list[str]:
    """What a project's test of its search asserts, with the task run in ``save()``."""
    with transaction.atomic():
        Article.objects.create(title="Saved inside a block")
    Article.objects.create(title="Saved in autocommit")
    return found("saved")


def compare_backends() -> None:
    """The test above on ImmediateBackend, then on JobsBackend without and with the test mode."""
    with override_settings(TASKS={"default": {"BACKEND": IMMEDIATE}}):
        expected = a_test_written_for_the_immediate_backend()
    assert expected == ["Saved in autocommit", "Saved inside a block"]
    Article.objects.all().delete()  # modelsearch unindexes them as they go

    with override_settings(TASKS={"default": {"BACKEND": JOBS}}, DJANGO_JOBS={}):
        assert a_test_written_for_the_immediate_backend() == []  # the report
    Article.objects.all().delete()
    JobRun.objects.all().delete()  # their articles are gone

    with override_settings(
        TASKS={"default": {"BACKEND": JOBS}}, DJANGO_JOBS={"RUN_ON_COMMIT": True}
    ):
        assert a_test_written_for_the_immediate_backend() == expected
    assert list(JobRun.objects.values_list("job_type", "status")) == [(TASK, Status.COMPLETED)] * 2


@pytest.mark.django_db
def test_the_test_mode_passes_a_test_written_for_the_immediate_backend() -> None:
    # As in a TestCase: the test's transaction never commits.
    if connection.vendor == "mysql":
        pytest.skip("InnoDB's full-text index shows no row before its commit")
    compare_backends()


@pytest.mark.django_db(transaction=True)
def test_the_test_mode_passes_it_with_real_commits() -> None:
    compare_backends()
