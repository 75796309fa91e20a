"""JobScheduleAdmin: the periodic schedules as the workers last saw them. Read-only.

Schedules are declared in code and settings; their rows are written by the
workers' schedulers only (``django_jobs.scheduler``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .. import conf
from ..models import JobSchedule
from ..registry import all_handlers
from ..schedules import entries
from .labels import FieldLabels


@admin.register(JobSchedule)
class JobScheduleAdmin(FieldLabels, admin.ModelAdmin):  # type: ignore[type-arg]
    field_labels = {
        "name": _("name"),
        "job_type": _("job type"),
        "cron": _("cron"),
        "timezone": _("time zone"),
        "missed": _("missed ticks"),
        "last_tick": _("last tick"),
        "next_tick": _("next tick"),
        "created_at": _("created at"),
        "updated_at": _("updated at"),
    }
    list_display = [
        "name",
        "job_type",
        "cron",
        "timezone",
        "missed",
        "last_tick",
        "next_tick",
        "declared",
    ]
    list_filter = ["missed"]
    search_fields = ["name", "job_type"]
    readonly_fields = (
        "name",
        "job_type",
        "cron",
        "timezone",
        "missed",
        "last_tick",
        "next_tick",
        "overdue",
        "declared",
        "created_at",
        "updated_at",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobSchedule]:
        queryset: QuerySet[JobSchedule] = super().get_queryset(request)
        return queryset.using(conf.get().DATABASE)

    @admin.display(description=_("overdue"), boolean=True)
    def overdue(self, schedule: JobSchedule) -> bool:
        """Whether the next tick has passed unhandled: no worker of the job's pool schedules it."""
        return schedule.next_tick is not None and schedule.next_tick < timezone.now()

    @admin.display(description=_("declared"), boolean=True)
    def declared(self, schedule: JobSchedule) -> bool:
        """Whether this code base still declares the schedule (a removed one's row stays)."""
        return schedule.name in {entry.name for entry in entries(all_handlers())}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
