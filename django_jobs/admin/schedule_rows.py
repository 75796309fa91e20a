"""What the schedule pages load of a row, bounded, and the download of a schedule's input.

A row may hold anything (written by hand: the database is trusted, but one bad
row must not break the pages), and a run-time schedule's input may be as big
as a run's. So the list loads no input and a cut of the cron text; a
schedule's page loads the first ``SHOWN`` characters of its input, as text,
and decodes them only when they are the whole of it. A bigger input, or one
Python cannot decode, is shown cut and not offered for editing, and the whole
of it is a download behind the view permission, as a run's payloads are.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast, Left, Length
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils.safestring import SafeString

from .. import conf
from ..models import JobSchedule
from ..schedule_api import storable_name
from ..schedule_targets import code_entries
from ..schedules import MAX_CRON
from .display import EMPTY, SHOWN, preformatted, pretty_json, timestamp


def bounded(queryset: QuerySet[JobSchedule]) -> QuerySet[JobSchedule]:
    """``queryset`` without the input, and the cron text cut past ``MAX_CRON``
    (``cron_cut``): what any page may load of any row."""
    return queryset.defer("input", "cron").annotate(cron_cut=Left("cron", MAX_CRON + 1))


def load_definition(schedule: JobSchedule) -> None:
    """Give ``schedule`` (read through ``bounded()``) its cron text and what may be
    shown of its input: ``input_text`` (at most ``SHOWN + 1`` characters),
    ``input_size``, and ``input`` itself when that text is the whole of a value
    Python can decode (``input_whole``)."""
    schedule.cron = schedule.cron_cut  # type: ignore[attr-defined]
    text = Cast("input", TextField())
    found = (
        JobSchedule.objects.using(conf.get().DATABASE)
        .filter(pk=schedule.pk)
        .values_list(Length(text), Left(text, SHOWN + 1))
        .first()
    )
    size, cut = found if found is not None else (None, None)
    schedule.input_size = size  # type: ignore[attr-defined]
    schedule.input_text = cut  # type: ignore[attr-defined]
    schedule.input_whole = False  # type: ignore[attr-defined]
    if cut is None or len(cut) > SHOWN:
        if cut is None:
            schedule.input = None
            schedule.input_whole = True  # type: ignore[attr-defined]
        return
    try:
        schedule.input = json.loads(cut)
    except (ValueError, RecursionError):
        return  # shown as the text it is
    schedule.input_whole = True  # type: ignore[attr-defined]


def cron_is_whole(schedule: JobSchedule) -> bool:
    return len(str(getattr(schedule, "cron_cut", schedule.cron))) <= MAX_CRON


def when(value: datetime | None) -> SafeString | str:
    """``timestamp()``, or the UTC instant as stored where the local time would fall
    outside the years Python knows (a row may say year 1 or 9999)."""
    try:
        return timestamp(value)
    except (OverflowError, ValueError):
        return str(value)


class ScheduleRowsMixin:
    """Adds ``<name>/input/`` (the whole input, as a file) to JobScheduleAdmin."""

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.input_view)  # type: ignore[attr-defined]
        urls = [path("<path:object_id>/input/", view, name="django_jobs_jobschedule_input")]
        return [*urls, *super().get_urls()]  # type: ignore[misc]

    def input_url(self, schedule: JobSchedule) -> str:
        from django.contrib.admin.utils import quote

        name = self.admin_site.name  # type: ignore[attr-defined]
        return reverse(f"{name}:django_jobs_jobschedule_input", args=[quote(schedule.pk)])

    def input_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        name = unquote(object_id)
        if not storable_name(name):
            raise Http404("no such schedule")
        rows = JobSchedule.objects.using(conf.get().DATABASE).filter(name=name)
        found = rows.values_list("source", Cast("input", TextField())).first()
        if found is None:
            raise Http404("no such schedule")
        source, text = found
        if source != "runtime":
            # A code schedule's input is in the code, not in its row.
            entry = next((e for e in code_entries(None) if e.name == name), None)
            if entry is None:
                raise Http404("no such schedule")
            text = json.dumps(entry.schedule.input, cls=DjangoJSONEncoder, ensure_ascii=False)
        response = HttpResponse(
            "null" if text is None else text, content_type="application/json; charset=utf-8"
        )
        # Not the schedule's name: a row may hold any text there.
        response["Content-Disposition"] = 'attachment; filename="schedule-input.json"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def shown_input(self, schedule: JobSchedule, code_input: Any) -> SafeString | str:
        """A run-time schedule's input as ``load_definition()`` read it, or a code one's."""
        whole = self.input_url(schedule)
        if not schedule.runtime:
            return pretty_json(code_input, whole=whole)
        if getattr(schedule, "input_whole", False):
            return pretty_json(schedule.input, whole=whole)
        text = getattr(schedule, "input_text", None)
        if text is None:
            return EMPTY
        return preformatted(text, whole=whole, limit=SHOWN, size=schedule.input_size)  # type: ignore[attr-defined]
