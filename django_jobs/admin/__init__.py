"""Django admin for operators: runs, their steps, workers and pools.

The admin reads the tables and changes runs only through ``django_jobs.api``.
"""

from django.contrib import admin

from ..models import JobRun, Worker
from . import schedules  # noqa: F401 - registers JobScheduleAdmin
from .runs import JobRunAdmin
from .workers import WorkerAdmin

admin.site.register(JobRun, JobRunAdmin)
admin.site.register(Worker, WorkerAdmin)

__all__ = ["JobRunAdmin", "WorkerAdmin"]
