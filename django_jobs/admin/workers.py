"""WorkerAdmin: the workers, their heartbeats and the runs they hold."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import conf
from ..models import JobRun, Status, Worker, WorkerStatus
from ..snapshot import POOLS_TEXT, pool_names, read_stored, text_of
from . import display
from .display import EMPTY
from .labels import FieldLabels
from .params import CheckedChangeList


class WorkerAdmin(CheckedChangeList, FieldLabels, admin.ModelAdmin):  # type: ignore[type-arg]
    field_labels = {
        "id": _("id"),
        "hostname": _("host name"),
        "pid": _("process id"),
        "status": _("status"),
        "concurrency": _("concurrency"),
        "started_at": _("started at"),
        "heartbeat_at": _("heartbeat at"),
        "stopped_at": _("stopped at"),
    }
    list_display = [
        "__str__",
        "status",
        "pool_list",
        "concurrency",
        "running",
        "started_at",
        "heartbeat_at",
        "heartbeat_age",
        "stopped_at",
    ]
    list_filter = ["status"]
    ordering = ["-started_at"]
    readonly_fields = (
        "id",
        "hostname",
        "pid",
        "status",
        "pool_list",
        "concurrency",
        "started_at",
        "heartbeat_at",
        "heartbeat_age",
        "stopped_at",
        "running_runs",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        queryset: QuerySet[Worker] = super().get_queryset(request)
        # A subquery served by the partial index on running runs: a join would
        # count through every run the worker ever held.
        running = (
            JobRun.objects.filter(claimed_by=OuterRef("pk"), status=Status.RUNNING)
            .order_by()
            .values("claimed_by")
            .annotate(n=Count("id"))
            .values("n")
        )
        # The pools are read as text (see runs.JSON_COLUMNS): one row Python
        # cannot decode must not fail the page.
        return (
            queryset.using(conf.get().DATABASE)
            .defer("pools")
            .annotate(
                running_count=Coalesce(Subquery(running), 0),
                pools_text=text_of("pools", POOLS_TEXT),
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("pools"))
    def pool_list(self, worker: Worker) -> str:
        text = getattr(worker, "pools_text", None)
        served = pool_names(read_stored(text, f"worker={worker.pk} pools", POOLS_TEXT))
        return display.listed(served)

    @admin.display(description=_("running"), ordering="running_count")
    def running(self, worker: Worker) -> int:
        return int(getattr(worker, "running_count", 0))

    @admin.display(description=_("heartbeat age"))
    def heartbeat_age(self, worker: Worker) -> str:
        if worker.status in (WorkerStatus.STOPPED, WorkerStatus.LOST):
            return EMPTY
        return display.duration(worker.heartbeat_at, timezone.now())

    @admin.display(description=_("running runs"))
    def running_runs(self, worker: Worker) -> SafeString | str:
        runs = list(
            JobRun.objects.using(conf.get().DATABASE)
            .filter(claimed_by=worker, status=Status.RUNNING)
            .only("id", "job_type", "status")[:100]
        )
        if not runs:
            return EMPTY
        return format_html_join(", ", "{}", ((display.run_label(run),) for run in runs))
