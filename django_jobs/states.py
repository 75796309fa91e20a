"""The states and choices of the job tables: a run's status and its sets, why a
run is held, a worker's status, close policies, rate-limit scopes and schedule
sources, with the constants the tables use.

They live apart from the models so that modules below the tables can name a
state; ``django_jobs.models`` exports each of them too.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    WAITING = "waiting", _("Waiting")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    TIMED_OUT = "timed_out", _("Timed out")
    CANCELED = "canceled", _("Canceled")


# Every set of statuses, defined here only, in display order (columns follow it).
# A run is unfinished until it ends in one of the finished statuses, for good.
UNFINISHED_STATUSES = (Status.PENDING, Status.RUNNING, Status.WAITING)
FINISHED_STATUSES = (Status.COMPLETED, Status.FAILED, Status.TIMED_OUT, Status.CANCELED)
# Finishing in one of these applies the close policies of the run's children.
UNSUCCESSFUL_STATUSES = (Status.FAILED, Status.TIMED_OUT, Status.CANCELED)
# What ``retry()`` accepts: the unsuccessful ones.
RETRYABLE_STATUSES = UNSUCCESSFUL_STATUSES

# The turn of a pending run that is not due yet (``JobRun.turn``): after every
# other turn, so that claims for due runs find it last, if at all.
LATER = 1 << 62
# The run_at of a run waiting for an event without a deadline: never due.
NO_DEADLINE = datetime(9999, 12, 30, tzinfo=UTC)


class ClosePolicy(models.TextChoices):
    TERMINATE = "terminate", _("Terminate")
    ABANDON = "abandon", _("Abandon")
    REQUEST_CANCEL = "request_cancel", _("Request cancel")


class Hold(models.TextChoices):
    """Why a pending run is out of the claim's way (``JobRun.hold``): ready, or held.

    A held run is not in the claim's index: a claim reads ready runs only. It is
    made ready again by what frees it (``storage.holds``).
    """

    READY = "", _("Ready")
    KEY = "key", _("Its concurrency key is taken")
    TENANT = "tenant", _("Its tenant runs as many runs as its cap allows")
    RATE = "rate", _("Its rate limit's window is full")


class WorkerStatus(models.TextChoices):
    RUNNING = "running", _("Running")
    STOPPING = "stopping", _("Stopping")
    STOPPED = "stopped", _("Stopped")
    LOST = "lost", _("Lost")


class RateLimitScope(models.TextChoices):
    POOL = "pool", _("Pool")
    JOB = "job", _("Job type")
    KEY = "key", _("Key")


class ScheduleSource(models.TextChoices):
    CODE = "code", _("code")  # @job(schedule=...) or DJANGO_JOBS["SCHEDULES"]
    RUNTIME = "runtime", _("run time")  # add_schedule() or the admin
