"""A project that names JobsBackend in TASKS but has not installed django_jobs.

Its checks say so in one line (django_jobs.E006), and its enqueue() raises
ImproperlyConfigured: nothing imports the models, whose import would crash it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import django
import pytest

from tests.helpers import ROOT

ENQUEUE = """
import django
django.setup()
from tests.without_app.tasks import hello
try:
    hello.enqueue("world")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def run(*args: str, imported_at_start: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.without_app.settings"
    env["PYTHONPATH"] = str(ROOT)
    env["TASKS_IMPORTED_AT_START"] = "1" if imported_at_start else "0"
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_reports_e006_in_one_line() -> None:
    result = run("-m", "django", "check")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "django_jobs." in line]
    assert errors == [
        "?: (django_jobs.E006) TASKS['default'] uses JobsBackend, but django_jobs is not installed."
    ]
    assert 'HINT: Add "django_jobs" to INSTALLED_APPS and run migrate.' in result.stderr


@pytest.mark.parametrize("imported_at_start", [True, False])
def test_enqueue_raises_improperly_configured(imported_at_start: bool) -> None:
    result = run("-c", ENQUEUE, imported_at_start=imported_at_start)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "ImproperlyConfigured TASKS['default'] uses JobsBackend, but django_jobs is not "
        'installed. Add "django_jobs" to INSTALLED_APPS and run migrate.\n'
    )


@pytest.mark.skipif(django.VERSION < (6, 0), reason="the backport's app registers the checks")
def test_without_the_tasks_framework_imported_django_runs_no_backend_check() -> None:
    # Django registers the tasks backends' checks when django.tasks is first
    # imported: a project that imports no task at startup gets no E006 (Django's
    # doing), and nothing crashes either.
    result = run("-m", "django", "check", imported_at_start=False)
    assert result.returncode == 0, result.stderr
    assert "django_jobs" not in result.stderr
