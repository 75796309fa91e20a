"""JobScheduleAdmin: every schedule; run-time ones are added, changed and deleted here.

A schedule declared in code (``@job(schedule=...)``, ``DJANGO_JOBS["SCHEDULES"]``)
is read-only here, but may be paused and resumed: an operator must be able to
stop a schedule that does harm without waiting for a deploy. Every change goes
through ``django_jobs.schedule_api``, which records it in the history
(``LogEntry``); pausing and resuming need ``django_jobs.pause_jobschedule``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import BadRequest
from django.db.models import BooleanField, Case, QuerySet, Value, When
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import conf
from ..exceptions import JobsError
from ..models import JobSchedule
from ..schedule_api import (
    FIELDS,
    add_schedule,
    change_schedule,
    delete_schedule,
    pause_schedule,
    resume_schedule,
    storable_name,
)
from ..schedule_targets import code_entries, runtime_entry
from ..schedules import Entry, plan
from .display import EMPTY
from .labels import FieldLabels
from .params import CheckedChangeList
from .schedule_forms import ScheduleForm
from .schedule_rows import ScheduleRowsMixin, bounded, cron_is_whole, load_definition, when

CRON_SHOWN = 100  # characters of a cron expression in the list (a row may hold any text)
PREVIEWED = 100  # schedules listed on a confirmation page


class PausedFilter(admin.SimpleListFilter):
    title = _("paused")
    parameter_name = "paused"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(paused_at__isnull=self.value() == "no")
        return queryset


def _declared() -> dict[str, Entry]:
    """The schedules this code declares, by name."""
    return {entry.name: entry for entry in code_entries(None)}


def _instant(field: str, label: Any) -> Any:
    """A column showing a stored instant as ``when()`` does (a row may hold any)."""

    @admin.display(description=label, ordering=field)
    def shown(self: Any, schedule: JobSchedule) -> SafeString | str:
        return when(getattr(schedule, field))

    return shown


@admin.register(JobSchedule)
class JobScheduleAdmin(
    ScheduleRowsMixin,
    CheckedChangeList,
    FieldLabels,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    field_labels = {
        "name": _("name"),
        "source": _("source"),
        "job_type": _("job type"),
        "cron": _("cron"),
        "timezone": _("time zone"),
        "missed": _("missed ticks"),
        "paused_at": _("paused at"),
        "revision": _("revision"),
        "last_tick": _("last tick"),
        "next_tick": _("next tick"),
        "created_at": _("created at"),
        "updated_at": _("updated at"),
    }
    form = ScheduleForm
    list_display = [
        "name",
        "origin",
        "job_type",
        "cron_shown",
        "timezone",
        "missed",
        "state",
        "last_tick_shown",
        "next_tick_shown",
    ]
    list_filter = ["source", PausedFilter, "missed"]
    search_fields = ["name", "job_type"]
    actions = ["pause_schedules", "resume_schedules", "delete_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobSchedule]:
        queryset: QuerySet[JobSchedule] = super().get_queryset(request)
        names = list(_declared())
        return bounded(queryset.using(conf.get().DATABASE)).annotate(
            declared_in_code=Case(
                When(name__in=names, then=Value(True)),
                default=Value(False),
                output_field=BooleanField(),
            )
        )

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        # A name no row can hold (a NUL, a lone surrogate, too long) is a crafted
        # URL: 404, rather than a statement PostgreSQL refuses.
        if from_field is None and not storable_name(object_id):
            raise Http404("no such schedule")
        schedule = super().get_object(request, object_id, from_field)
        if schedule is not None:
            load_definition(schedule)
        return schedule

    def response_action(  # type: ignore[override]
        self, request: HttpRequest, queryset: QuerySet[JobSchedule], **kwargs: Any
    ) -> Any:
        # The list posts the ticked schedules' names; one no row can hold is crafted.
        if not all(map(storable_name, request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))):
            raise BadRequest("a selected schedule is not a schedule's name")
        return super().response_action(request, queryset, **kwargs)

    # --- columns ------------------------------------------------------------------

    last_tick_shown = _instant("last_tick", _("last tick"))
    next_tick_shown = _instant("next_tick", _("next tick"))
    created_at_shown = _instant("created_at", _("created at"))
    updated_at_shown = _instant("updated_at", _("updated at"))

    @admin.display(description=_("declared"), boolean=True)
    def declared(self, schedule: JobSchedule) -> bool:
        """Whether this code base still declares the schedule (a removed one's row stays)."""
        known = getattr(schedule, "declared_in_code", None)
        return bool(schedule.name in _declared() if known is None else known)

    @admin.display(description=_("source"), ordering="source")
    def origin(self, schedule: JobSchedule) -> str:
        if schedule.runtime:
            return str(_("run time"))
        if self.declared(schedule):
            return str(_("code"))
        return str(_("code, no longer declared"))

    @admin.display(description=_("cron"), ordering="cron")
    def cron_shown(self, schedule: JobSchedule) -> str:
        cron = str(getattr(schedule, "cron_cut", schedule.cron))
        return cron if len(cron) <= CRON_SHOWN else cron[:CRON_SHOWN] + "…"

    @admin.display(description=_("state"))
    def state(self, schedule: JobSchedule) -> SafeString | str:
        if schedule.paused:
            return format_html("{} {}", _("paused since"), when(schedule.paused_at))
        if self.overdue(schedule):
            return str(_("overdue: no worker of its pool schedules it"))
        return str(_("active"))

    @admin.display(description=_("overdue"), boolean=True)
    def overdue(self, schedule: JobSchedule) -> bool:
        """Whether the next tick has passed unhandled: no worker of the job's pool schedules it."""
        if schedule.paused:
            return False
        return schedule.next_tick is not None and schedule.next_tick < timezone.now()

    @admin.display(description=_("input"))
    def input_shown(self, schedule: JobSchedule) -> SafeString | str:
        entry = None if schedule.runtime else _declared().get(schedule.name)
        if entry is None and not schedule.runtime:
            return EMPTY
        return self.shown_input(schedule, None if entry is None else entry.schedule.input)

    # --- the pages: who may do what -------------------------------------------------

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_change_permission(request, obj)
        return allowed and (obj is None or obj.runtime)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A code schedule's row may go once the code no longer declares it.
        allowed = super().has_delete_permission(request, obj)
        return allowed and (obj is None or obj.runtime or not self.declared(obj))

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.pause_jobschedule"))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["name", *FIELDS, "paused"]
        editable = self.has_change_permission(request, obj)
        # Values the API would not accept (a row written some other way), or too
        # big for a page, are shown cut rather than put whole in a form field.
        cron = "cron" if editable and cron_is_whole(obj) else "cron_shown"
        small = obj.runtime and getattr(obj, "input_whole", False)
        return [
            "name",
            "origin",
            "job_type",
            cron,
            "timezone",
            "missed",
            "input" if editable and small else "input_shown",
            "state",
            "last_tick_shown",
            "next_tick_shown",
            "revision",
            "created_at_shown",
            "updated_at_shown",
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        editable = FIELDS if self.has_change_permission(request, obj) else ()
        return [field for field in self.get_fields(request, obj) if field not in editable]

    # --- saving: through the API, which records each change ---------------------------

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        values = {field: form.cleaned_data[field] for field in FIELDS if field in form.fields}
        if change:
            row = change_schedule(obj.name, user=request.user, **values)
        else:
            job_type, cron = values.pop("job_type"), values.pop("cron")
            paused = bool(form.cleaned_data.get("paused"))
            row = add_schedule(obj.name, job_type, cron, paused=paused, user=request.user, **values)
        obj.__dict__.update({k: v for k, v in row.__dict__.items() if k != "_state"})
        obj._state.adding, obj._state.db = False, row._state.db

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        delete_schedule(obj.name, user=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[JobSchedule]) -> None:
        for schedule in queryset:
            delete_schedule(schedule.name, user=request.user)

    # The API records every change, with the same user: the admin's own records
    # would be a second entry for each.
    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        return None

    # --- pause and resume ---------------------------------------------------------------

    @admin.action(permissions=["pause"], description=_("Pause selected schedules"))
    def pause_schedules(
        self, request: HttpRequest, queryset: QuerySet[JobSchedule]
    ) -> HttpResponse | None:
        return self._pause_or_resume(request, queryset, pause=True)

    @admin.action(permissions=["pause"], description=_("Resume selected schedules"))
    def resume_schedules(
        self, request: HttpRequest, queryset: QuerySet[JobSchedule]
    ) -> HttpResponse | None:
        return self._pause_or_resume(request, queryset, pause=False)

    def _pause_or_resume(
        self, request: HttpRequest, queryset: QuerySet[JobSchedule], *, pause: bool
    ) -> HttpResponse | None:
        if request.POST.get("confirm") != "yes":
            return self._confirmation(request, queryset, pause=pause)
        change = pause_schedule if pause else resume_schedule
        changed = skipped = 0
        for schedule in queryset:
            try:
                done = change(schedule.name, user=request.user)
            except JobsError:  # deleted meanwhile
                done = False
            changed, skipped = changed + done, skipped + (not done)
        if pause:
            text = ngettext(
                "Paused %(changed)d schedule, %(skipped)d skipped (paused already).",
                "Paused %(changed)d schedules, %(skipped)d skipped (paused already).",
                changed,
            )
        else:
            text = ngettext(
                "Resumed %(changed)d schedule, %(skipped)d skipped (not paused).",
                "Resumed %(changed)d schedules, %(skipped)d skipped (not paused).",
                changed,
            )
        level = messages.SUCCESS if changed else messages.WARNING
        self.message_user(request, text % {"changed": changed, "skipped": skipped}, level)
        return None

    def _confirmation(
        self, request: HttpRequest, queryset: QuerySet[JobSchedule], *, pause: bool
    ) -> HttpResponse:
        now = timezone.now()
        shown = list(queryset[:PREVIEWED])
        context = {
            **self.admin_site.each_context(request),
            "title": _("Pause schedules: are you sure?")
            if pause
            else _("Resume schedules: are you sure?"),
            "opts": self.opts,
            "pause": pause,
            "schedules": [(s, "" if pause else _resumed(s, now)) for s in shown],
            "total": queryset.count(),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action_name": "pause_schedules" if pause else "resume_schedules",
        }
        return TemplateResponse(
            request, "admin/django_jobs/jobschedule/confirm_pause.html", context
        )


def _resumed(schedule: JobSchedule, now: Any) -> str:
    """What resuming ``schedule`` now does with the ticks missed meanwhile."""
    if not schedule.paused:
        return str(_("not paused: nothing changes"))
    try:
        if schedule.runtime:
            row = {f: getattr(schedule, f) for f in ("name", "job_type", "timezone", "missed")}
            entry: Entry | None = runtime_entry({**row, "cron": schedule.cron_cut})  # type: ignore[attr-defined]
        else:
            entry = _declared().get(schedule.name)
        if entry is None:
            return str(_("no longer declared: nothing starts"))
        decided = plan(entry.schedule, schedule.last_tick or schedule.created_at, now)
    except Exception as exc:  # whatever the row holds (a year 9999 overflows)
        return str(_("cannot be scheduled: %(error)s") % {"error": str(exc)[:300]})
    if not decided.run and not decided.missed:
        return str(_("no tick was missed"))
    return str(
        _("%(runs)d run(s) start for ticks missed, %(skipped)d missed tick(s) are skipped")
        % {"runs": len(decided.run), "skipped": decided.missed}
    )
