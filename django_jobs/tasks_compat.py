"""The tasks framework's names: ``django.tasks`` (Django 6.0+) or the django-tasks backport.

On Django 5.2 the same backend works when the ``django-tasks`` package is
installed (``pip install "django-durable-jobs[tasks]"``); its ``@task`` functions and
``TASKS`` setting are then those of ``django_tasks``.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks import task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2
    try:
        from django_tasks import (  # type: ignore[assignment,no-redef,unused-ignore]
            task,
            task_backends,
        )
        from django_tasks.backends.base import (  # type: ignore[assignment,no-redef,unused-ignore]
            BaseTaskBackend,
        )
        from django_tasks.base import (  # type: ignore[assignment,no-redef,unused-ignore]
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import (  # type: ignore[assignment,no-redef,unused-ignore]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[assignment,no-redef,unused-ignore]
            TaskResultDoesNotExist,
        )
        from django_tasks.signals import (  # type: ignore[no-redef,unused-ignore]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json  # type: ignore[no-redef,unused-ignore]
    except ImportError as exc:
        raise ImproperlyConfigured(
            "django_jobs.tasks_backend needs Django 6.0 or later (django.tasks), or on "
            'Django 5.2 the django-tasks package: pip install "django-durable-jobs[tasks]"'
        ) from exc

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
