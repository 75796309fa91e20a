from __future__ import annotations

from django_jobs.tasks_compat import task


@task
def hello(name: str) -> str:
    return f"hello {name}"
