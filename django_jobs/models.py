"""The job tables: JobRun, JobStep, JobEvent and Worker.

QuerySet methods are predicates (which rows). Statements that lock or fence rows
live in ``storage``, the transitions of a run in ``transitions``, and the writers
users call in ``api``.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core import checks
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Coalesce, Now
from django.utils.translation import gettext_lazy as _

from .states import (
    FINISHED_STATUSES,
    LATER,
    NO_DEADLINE,
    RETRYABLE_STATUSES,
    UNFINISHED_STATUSES,
    UNSUCCESSFUL_STATUSES,
    ClosePolicy,
    Hold,
    RateLimitScope,
    ScheduleSource,
    Status,
    WorkerStatus,
)

# The tables, and the states and choices they use (defined in states.py).
__all__ = [
    "FINISHED_STATUSES",
    "LATER",
    "NO_DEADLINE",
    "RETRYABLE_STATUSES",
    "UNFINISHED_STATUSES",
    "UNSUCCESSFUL_STATUSES",
    "ClosePolicy",
    "Hold",
    "JobEvent",
    "JobPool",
    "JobRateLimit",
    "JobRun",
    "JobRunQuerySet",
    "JobSchedule",
    "JobStep",
    "RateLimitScope",
    "ScheduleSource",
    "Status",
    "Worker",
    "WorkerStatus",
    "protect_running_runs",
]


def protect_running_runs(collector: Any, field: Any, sub_objs: Any, using: str) -> None:
    """``on_delete`` of ``JobRun.claimed_by``: refuse to delete a worker that holds runs.

    A running run whose worker row is gone could not be told from a live
    worker's: deleting the row would get the runs of a worker that still runs
    them rescued. Runs the worker no longer holds forget it (``SET_NULL``).
    """
    if isinstance(sub_objs, models.QuerySet):
        running = list(sub_objs.filter(status=Status.RUNNING).only("pk", "claimed_by")[:100])
    else:
        running = [run for run in sub_objs if run.status == Status.RUNNING]
    if running:
        raise models.ProtectedError(
            f"Cannot delete worker {running[0].claimed_by_id}: it holds running runs "
            "(they are rescued once it stops heartbeating)",
            set(running),
        )
    models.SET_NULL(collector, field, sub_objs, using)


def __getattr__(name: str) -> Any:
    # The earlier name of FINISHED_STATUSES, kept working (with a warning) for
    # code written against it.
    if name == "TERMINAL_STATUSES":
        warnings.warn(
            "django_jobs.models.TERMINAL_STATUSES is deprecated: use FINISHED_STATUSES",
            DeprecationWarning,
            stacklevel=2,
        )
        return frozenset(FINISHED_STATUSES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class JobRunQuerySet(models.QuerySet["JobRun"]):
    def due(self, pools: Sequence[str] | None = None) -> JobRunQuerySet:
        """Ready pending runs (of ``pools``, or all) whose time has come: the claim's
        predicate. Held runs (``JobRun.hold``) are not due until they are ready."""
        runs = self.filter(status=Status.PENDING, hold=Hold.READY, run_at__lte=Now())
        return runs if pools is None else runs.filter(pool__in=pools)

    def unfinished(self) -> JobRunQuerySet:
        return self.exclude(status__in=FINISHED_STATUSES)


class Worker(models.Model):
    """One live (or once live) ``runjobworker`` process, with its heartbeat."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    pools = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.RUNNING
    )
    started_at = models.DateTimeField(db_default=Now())
    heartbeat_at = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="django_jobs_worker_live")]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


class JobPool(models.Model):
    """A pool workers claim from; a paused pool's pending runs are left unclaimed.

    Rows are made by workers at start and by ``jobpool pause``; a pool without a row
    is simply not paused.
    """

    name = models.CharField(max_length=100, primary_key=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    pause_reason = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = _("job pool")
        verbose_name_plural = _("job pools")
        ordering = ["name"]
        permissions = [("pause_jobpool", "Can pause and resume pools")]

    def __str__(self) -> str:
        return self.name

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


class JobRun(models.Model):
    """One run of a job: its input, state, attempts, lease and outcome."""

    id = models.BigAutoField(primary_key=True)
    job_type = models.CharField(max_length=200)
    pool = models.CharField(max_length=100, default="default")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    priority = models.SmallIntegerField(default=0)
    run_at = models.DateTimeField(db_default=Now())
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    # The Worker ids of this run's counted attempts, in order: entry n ran
    # attempt n + 1, so its length always equals ``attempts``.
    worker_ids = models.JSONField(
        default=list, db_default=models.Value([], output_field=models.JSONField()), blank=True
    )

    input = models.JSONField(encoder=DjangoJSONEncoder, default=dict, blank=True)
    output = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    error = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)

    # NULL, not "", means "no key": the partial unique constraints skip NULLs.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    # At most so many runs of the key run at once: each running run of a key
    # holds one of its slots (0 to limit - 1), unique while it runs.
    concurrency_limit = models.PositiveSmallIntegerField(default=1, db_default=1)
    concurrency_slot = models.PositiveSmallIntegerField(null=True, blank=True)
    # A pending run is ready ("") or held (Hold): only ready runs are claimed.
    hold = models.CharField(
        max_length=8, choices=Hold.choices, default=Hold.READY, db_default="", blank=True
    )
    # The run's turn among the ready runs of its pool and priority (storage.turns):
    # a claim takes the lowest turns first, so tenants take turns. LATER while
    # the run is not due yet, until the worker gives it a turn when it is.
    turn = models.BigIntegerField(default=0, db_default=0, editable=False)
    # Whether the run's handler is an ``async def`` (as the starting process knew
    # it): a worker's event loop claims such runs, its threads the others, each
    # from its own part of the claim's index, so neither reads past the other's.
    is_async = models.BooleanField(default=False, db_default=False, editable=False)
    # The key of the run's job's rate limit, when the job declares rate_limit_key;
    # runs of other limited jobs share their job type's limit (see ratelimits).
    rate_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    tags = models.JSONField(default=list, blank=True)
    tenant_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    # The slot of its tenant's cap in its pool a running run holds (0 to cap - 1),
    # when DJANGO_JOBS["TENANT_CONCURRENCY"] caps the pool; NULL otherwise.
    tenant_slot = models.PositiveSmallIntegerField(null=True, blank=True)
    trigger_source = models.CharField(max_length=32, default="api")
    trigger_ref = models.CharField(max_length=255, blank=True, default="")

    # Indexed by the partial indexes in Meta: most runs have no parent.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        db_index=False,
    )
    root = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="descendants",
        db_index=False,
    )
    close_policy = models.CharField(
        max_length=16, choices=ClosePolicy.choices, default=ClosePolicy.TERMINATE
    )

    # The handler's latest ctx.set_progress(): {"done", "total", "message", "at"}.
    progress = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)

    # The W3C trace context of the code that started the run ({"traceparent",
    # "tracestate"}), linked from each attempt's span; NULL when none was active.
    trace_context = models.JSONField(null=True, blank=True)

    # The child runs a waiting run waits for (ctx.wait_for); NULL while it sleeps.
    awaiting = models.JSONField(null=True, blank=True)
    # The name of the event a waiting run waits for (ctx.wait_for_event); its
    # run_at is then the wait's deadline (NO_DEADLINE without one).
    awaiting_event = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # Set by a caller blocked in JobRun.wait(): on PostgreSQL, the run's end then
    # sends a notification that wakes it (migration 0016's trigger).
    awaited = models.BooleanField(default=False, db_default=False, editable=False)

    # Running runs are found by worker through django_jobs_run_running; a full
    # index would be written at every claim and completion for the rare
    # deletion of a Worker row.
    claimed_by = models.ForeignKey(
        Worker,
        null=True,
        blank=True,
        on_delete=protect_running_runs,
        related_name="runs",
        db_index=False,
    )
    lease_token = models.UUIDField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True, default="")
    # False when cancel(cascade=False) asked a running run to stop: its
    # children are then left alone when it ends canceled.
    cancel_cascade = models.BooleanField(default=True)

    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobRunQuerySet.as_manager()

    class Meta:
        verbose_name = _("job run")
        verbose_name_plural = _("job runs")
        ordering = ["-id"]
        permissions = [
            ("retry_jobrun", "Can retry runs"),
            ("cancel_jobrun", "Can cancel runs"),
            ("run_now_jobrun", "Can start pending runs now"),
        ]
        indexes = [
            # Serves the claim query (claims.claim_batch): only ready pending
            # rows are in it, so its size grows neither with history nor with
            # runs held back (storage.holds). Per pool and kind (threads or
            # event loop): priority, then turn (fairness across tenants,
            # storage.turns), then age.
            models.Index(
                "pool",
                "is_async",
                models.F("priority").desc(),
                "turn",
                "run_at",
                name="django_jobs_run_claim_kind",
                condition=models.Q(status="pending", hold=""),
            ),
            # A tenant's last turn in a pool and priority (runs without a tenant
            # are one group), read when its runs are started (storage.turns).
            models.Index(
                "pool",
                "priority",
                "tenant_id",
                "turn",
                name="django_jobs_run_turns",
                condition=models.Q(status="pending", hold="", turn__lt=LATER),
            ),
            # Pending runs with a concurrency key, by key: holding those of a
            # taken key, and releasing the first held one when it is free.
            models.Index(
                "concurrency_key",
                "hold",
                models.F("priority").desc(),
                "run_at",
                name="django_jobs_run_keyed",
                condition=models.Q(status="pending", concurrency_key__isnull=False),
            ),
            # Pending runs of a tenant, by pool: holding those of a tenant at its
            # cap (TENANT_CONCURRENCY), and releasing the first held ones.
            models.Index(
                "tenant_id",
                "pool",
                "hold",
                models.F("priority").desc(),
                "run_at",
                name="django_jobs_run_tenanted",
                condition=models.Q(status="pending", tenant_id__isnull=False),
            ),
            # Runs held for their rate limit's window, by job type and key:
            # released as many as a window allows when it opens (storage.rateholds).
            models.Index(
                "job_type",
                "rate_key",
                models.F("priority").desc(),
                "turn",
                "run_at",
                name="django_jobs_run_rate_held",
                condition=models.Q(status="pending", hold="rate"),
            ),
            # Serves the rescue sweep: running rows by the worker holding them.
            models.Index(
                fields=["claimed_by"],
                name="django_jobs_run_running",
                condition=models.Q(status="running"),
            ),
            # Serves the wake-up of sleeping runs (claims.wake_sleepers).
            models.Index(
                fields=["run_at"],
                name="django_jobs_run_waiting",
                condition=models.Q(status="waiting"),
            ),
            # Every claim and completion writes a new version of the row into
            # every index whose condition it meets, so the other indexes are
            # partial: over runs that need attention (the admin's filters), over
            # children, over tenants. Completed runs, the bulk of the history,
            # are in none of them.
            models.Index(
                fields=["status", "job_type"],
                name="django_jobs_run_attention",
                condition=models.Q(
                    status__in=[Status.FAILED, Status.TIMED_OUT, Status.CANCELED, Status.WAITING]
                ),
            ),
            # Serves jobstatus's runs per minute and prunejobs's cutoff. A
            # finished run enters it once, when it ends.
            models.Index(
                fields=["finished_at"],
                name="django_jobs_run_finished",
                condition=models.Q(finished_at__isnull=False),
            ),
            models.Index(
                fields=["parent"],
                name="django_jobs_run_parent",
                condition=models.Q(parent__isnull=False),
            ),
            models.Index(
                fields=["root"],
                name="django_jobs_run_root",
                condition=models.Q(root__isnull=False),
            ),
            models.Index(
                fields=["tenant_id"],
                name="django_jobs_run_tenant",
                condition=models.Q(tenant_id__isnull=False),
            ),
        ]
        constraints = [
            # Idempotency keys are scoped by job type and tenant: two partial
            # indexes, since NULL (no tenant) is never equal to NULL in one.
            models.UniqueConstraint(
                fields=["job_type", "idempotency_key"],
                name="django_jobs_run_idempotency",
                condition=models.Q(idempotency_key__isnull=False, tenant_id__isnull=True),
            ),
            models.UniqueConstraint(
                fields=["job_type", "tenant_id", "idempotency_key"],
                name="django_jobs_run_tenant_idempotency",
                condition=models.Q(idempotency_key__isnull=False, tenant_id__isnull=False),
            ),
            # At most one running run per slot of a concurrency key, enforced by
            # the database: two workers claiming at the same instant cannot both
            # take a slot. A run claimed without a slot (by a worker older than
            # concurrency limits) holds slot 0.
            models.UniqueConstraint(
                models.F("concurrency_key"),
                Coalesce(models.F("concurrency_slot"), models.Value(0)),
                name="django_jobs_run_concurrency_slot",
                condition=models.Q(status="running", concurrency_key__isnull=False),
            ),
            # At most one running run per slot of a tenant's cap in a pool: a cap
            # is enforced by the database as a concurrency limit is.
            models.UniqueConstraint(
                fields=["tenant_id", "pool", "tenant_slot"],
                name="django_jobs_run_tenant_slot",
                condition=models.Q(
                    status="running", tenant_id__isnull=False, tenant_slot__isnull=False
                ),
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=Status.values),
                name="django_jobs_run_status_valid",
            ),
            # A lease token exists only while the run is running, so a write
            # fenced on the token alone is fenced on the status too.
            models.CheckConstraint(
                condition=models.Q(lease_token__isnull=True) | models.Q(status=Status.RUNNING),
                name="django_jobs_run_lease_running",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_type} #{self.pk} ({self.status})"

    def wait(self, timeout: float | timedelta | None = None) -> Any:
        """Block until this run has finished; return its output, or raise
        ``RunFailed``, ``RunTimedOut`` or ``RunCanceled`` (each carrying the run's
        error), or ``WaitTimeout`` after ``timeout`` seconds (the run is left as it
        is). Refused inside a handler: a handler waits durably with ``ctx.wait_for``."""
        from .results import wait_for_result

        return wait_for_result(self, timeout)

    async def await_result(self, timeout: float | timedelta | None = None) -> Any:
        """``wait`` for async code: the same outcomes, without blocking the event loop."""
        from .results import await_result

        return await await_result(self, timeout)

    @classmethod
    def check(cls, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's checks, without its warnings that partial and expression indexes
        are skipped: where they are (MySQL, MariaDB), migration 0002 builds their
        equivalents, and other such databases are refused (check E005)."""
        return [message for message in super().check(**kwargs) if message.id not in _REBUILT]


# Django's warnings about the indexes of JobRun it cannot build on a database:
# conditions of unique constraints, conditions of indexes, expressions in
# indexes and (Django 6.1) in unique constraints.
_REBUILT = frozenset({"models.W036", "models.W037", "models.W043", "models.W044"})


class JobRateLimit(models.Model):
    """The starts of one rate limit within its latest window, shared by every worker.

    Written only by the claim (``storage.ratelimits``), under this row's lock, so
    that workers admit runs one at a time per limit. ``starts`` holds
    ``[instant, count]`` pairs (instants in epoch seconds on the database clock)
    of the starts within the window; ``open_at`` is set while the window is
    full: the instant the next start is allowed, before which runs under this
    limit are not claimed.
    """

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=8, choices=RateLimitScope.choices)
    name = models.CharField(max_length=255)
    # The limit as last applied, for the admin and jobstatus.
    limit = models.PositiveIntegerField(default=0)
    period = models.FloatField(default=0.0)
    starts = models.JSONField(default=list, blank=True)
    open_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = _("rate limit")
        verbose_name_plural = _("rate limits")
        ordering = ["scope", "name"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "name"], name="django_jobs_ratelimit_unique"),
        ]
        indexes = [models.Index(fields=["open_at"], name="django_jobs_ratelimit_open")]

    def __str__(self) -> str:
        return f"{self.scope}:{self.name}"


class JobStep(models.Model):
    """The recorded outcome of one ``ctx.step`` of a run, memoized across attempts."""

    class StepStatus(models.TextChoices):
        COMPLETED = "completed", _("Completed")
        FAILED = "failed", _("Failed")

    id = models.BigAutoField(primary_key=True)
    # Indexed by django_jobs_step_unique (run first): no index of its own.
    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.CharField(max_length=255)
    seq = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    attempts = models.PositiveIntegerField(default=1)
    output = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    error = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("job step")
        verbose_name_plural = _("job steps")
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step_id"], name="django_jobs_step_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.step_id} of run {self.run_id}"


class JobEvent(models.Model):
    """An event sent to a run (``send_event``), kept until a wait of its name
    consumes it (``ctx.wait_for_event``): the oldest first, each by one wait."""

    id = models.BigAutoField(primary_key=True)
    # Indexed by django_jobs_event_run (run first): no index of its own.
    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="events", db_index=False)
    name = models.CharField(max_length=200)
    payload = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    sent_at = models.DateTimeField(db_default=Now())
    # When a wait consumed it, and the step that recorded it (``event:<name>``).
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        verbose_name = _("job event")
        verbose_name_plural = _("job events")
        ordering = ["run", "id"]
        # A wait takes the oldest event of its name not taken yet: read past none taken.
        indexes = [
            models.Index(fields=["run", "name", "consumed_at", "id"], name="django_jobs_event_run")
        ]

    def __str__(self) -> str:
        return f"event {self.name!r} to run {self.run_id}"


class JobSchedule(models.Model):
    """The state of one periodic schedule: the latest tick handled, shared by every worker.

    A schedule declared in code (``@job(schedule=...)`` or settings) has a row
    written by ``django_jobs.scheduler``, whose ``cron``, ``timezone`` and
    ``missed`` repeat the declaration as last seen by a worker, for the admin. A
    run-time schedule (``source="runtime"``, made by ``add_schedule()`` or the
    admin) is its row: the definition, its ``input`` included, lives here.
    """

    name = models.CharField(max_length=200, primary_key=True)
    source = models.CharField(
        max_length=16, choices=ScheduleSource.choices, db_default=ScheduleSource.CODE
    )
    job_type = models.CharField(max_length=200)
    cron = models.TextField()
    timezone = models.CharField(max_length=100)
    missed = models.CharField(max_length=16)
    # The latest tick handled (a run started, or missed and skipped); NULL
    # until the first: ticks after created_at are then the schedule's first.
    last_tick = models.DateTimeField(null=True, blank=True)
    # The tick after last_tick, for the admin; a past value means no worker
    # of the job's pool is scheduling.
    next_tick = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # The input of a run-time schedule's runs; a code schedule's is in the code.
    input = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    # While set, no run starts and last_tick stays: on resume, the ticks missed
    # meanwhile follow the missed policy.
    paused_at = models.DateTimeField(null=True, blank=True)
    # Raised by every operator change (edit, pause, resume): a worker takes a
    # tick only under the revision it read, and sees changes by it.
    revision = models.IntegerField(db_default=0)
    # New for every row made: a schedule deleted and added again under its name
    # starts again at revision 1, and this is how a worker that read the one
    # before tells them apart (it fences its ticks on both). NULL in the rows
    # that workers of an earlier release make.
    incarnation = models.UUIDField(null=True, blank=True, default=uuid.uuid4, editable=False)

    class Meta:
        verbose_name = _("job schedule")
        verbose_name_plural = _("job schedules")
        ordering = ["name"]
        permissions = [("pause_jobschedule", "Can pause and resume schedules")]

    def __str__(self) -> str:
        return self.name

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def runtime(self) -> bool:
        return self.source == ScheduleSource.RUNTIME
