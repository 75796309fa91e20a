"""A ``@task`` in an installed app that nothing imports: a run-time schedule's row that
names it must not get it imported (tests/integration/test_schedule_api.py)."""

from __future__ import annotations

from django_jobs.tasks_compat import task

IMPORTED = True


@task
def never_imported() -> None:
    return None
