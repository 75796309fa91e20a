"""A name read from a row never imports code: one guard wherever a stored task path is resolved.

A task run's job type is the task's module path. Whoever can write the table
is trusted, but a row still must not make a process import a module outside
the installed apps, nor reach a new module through a module's ``__getattr__``:
the worker, ``get_result()`` and the schedules all find a task the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_jobs.exceptions import UnknownJobType
from django_jobs.models import JobRun
from django_jobs.registry import get_handler
from django_jobs.tasks_backend import resolve_task, result_id, schedule_target, task_at
from django_jobs.tasks_compat import task_backends
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

OUTSIDE = "django_jobs_outside_module"  # on sys.path, in no installed app
LAZY = "django_jobs_lazy_module"  # imported, with a module __getattr__ that imports
PULLED = "django_jobs_pulled_module"  # what that __getattr__ would import


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[None]:
    """Three modules on ``sys.path``; each records its import in ``sys.modules``
    as any module does. The lazy one is imported, as a project's module may be."""
    (tmp_path / f"{OUTSIDE}.py").write_text("from tests.testapp.tasks import add as task\n")
    (tmp_path / f"{PULLED}.py").write_text("from tests.testapp.tasks import add as task\n")
    (tmp_path / f"{LAZY}.py").write_text(
        "import importlib\n\n"
        "def __getattr__(name):\n"
        f"    return importlib.import_module({PULLED!r})\n"
    )
    sys.path.insert(0, str(tmp_path))
    __import__(LAZY)
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        for name in (OUTSIDE, LAZY, PULLED):
            sys.modules.pop(name, None)


def task_run(job_type: str) -> JobRun:
    """A task's run, its stored job type then changed as a forged row would be."""
    result = tasks.add.enqueue(1, 2)
    run = JobRun.objects.get(pk=int(result.id.split(":")[0]))
    JobRun.objects.filter(pk=run.pk).update(job_type=job_type)
    run.refresh_from_db()
    return run


@pytest.mark.parametrize(
    "path", [f"{OUTSIDE}.task", f"{LAZY}.task", f"{LAZY}.anything"], ids=["outside", "lazy", "any"]
)
@pytest.mark.usefixtures("modules")
def test_get_result_of_a_forged_row_imports_nothing(path: str) -> None:
    run = task_run(path)
    backend = task_backends["default"]
    with pytest.raises(ImproperlyConfigured, match="is no longer a task"):
        backend.get_result(result_id(run.pk))
    assert OUTSIDE not in sys.modules
    assert PULLED not in sys.modules


@pytest.mark.parametrize("path", [f"{OUTSIDE}.task", f"{LAZY}.task"], ids=["outside", "lazy"])
@pytest.mark.usefixtures("modules")
def test_the_worker_and_the_schedules_import_nothing_for_a_forged_name(path: str) -> None:
    assert resolve_task(path) is None
    with pytest.raises(UnknownJobType):
        get_handler(path, resolve=True)
    assert schedule_target(path, importing=True) is None
    assert schedule_target(path, importing=False) is None
    assert OUTSIDE not in sys.modules
    assert PULLED not in sys.modules


@pytest.mark.parametrize(
    "path",
    [
        "",
        "add",
        ".add",
        "tests.testapp.tasks.",
        "tests..testapp.tasks.add",
        "tests.testapp.tasks.add\x00",
        "tests.testapp.tasks.add.using",  # an attribute of the task, not a task
        "os.path.join",
        "django_jobs.testing",  # reached through django_jobs' own lazy __getattr__
    ],
)
def test_names_that_designate_no_task_find_none(path: str) -> None:
    modules_before = set(sys.modules)
    assert task_at(path, importing=True) is None
    assert set(sys.modules) == modules_before


def test_a_task_of_an_installed_app_is_found_and_its_module_imported_once_needed() -> None:
    assert task_at("tests.testapp.tasks.add", importing=False) is tasks.add
    sys.modules.pop("tests.testapp.unimported_tasks", None)
    path = "tests.testapp.unimported_tasks.never_imported"
    assert task_at(path, importing=False) is None  # a row's schedule imports nothing
    assert "tests.testapp.unimported_tasks" not in sys.modules
    found = task_at(path, importing=True)  # a worker imports an installed app's module
    assert found is not None
    assert found.module_path == path
    sys.modules.pop("tests.testapp.unimported_tasks", None)
