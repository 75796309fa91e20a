"""Events on a run's page: what a waiting run waits for, the events it took and those
kept for it, and a form to send one (an approval), recorded as a ``LogEntry``.

Names and payloads are rows anyone who can send an event wrote: escaped, cut,
and a payload that does not decode is said so, never loaded whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F, TextField
from django.db.models.functions import Cast, Left
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import conf
from ..events import send_event
from ..exceptions import JobsError
from ..models import NO_DEADLINE, UNFINISHED_STATUSES, JobEvent, JobRun, Status
from ..names import MAX_EVENT_NAME, event_name
from ..payloads import cut, to_json
from . import display
from .params import run_of_page

# Events listed on a run's page (the newest), and characters of each payload shown.
EVENTS_SHOWN = 50
PAYLOAD_SHOWN = 200


def waiting_for_event(run: JobRun) -> SafeString | None:
    """What a run waiting for an event waits for: its name, since, until when."""
    if run.status != Status.WAITING or not run.awaiting_event:
        return None
    deadline: SafeString | str = (
        gettext("no deadline")
        if run.run_at is None or run.run_at >= NO_DEADLINE
        else format_html(gettext("until {time}"), time=display.timestamp(run.run_at))
    )
    return format_html(
        gettext("the event {name}, since {since}, {deadline}"),
        name=cut(run.awaiting_event, MAX_EVENT_NAME),
        since=display.timestamp(run.started_at),
        deadline=deadline,
    )


def event_list(run: JobRun) -> SafeString | str:
    """The run's events, newest first: name, sent, taken (by which wait) or kept."""
    rows = list(
        JobEvent.objects.using(conf.get().DATABASE)
        .filter(run_id=run.pk)
        .order_by("-id")
        .values(
            "id",
            "name",
            "sent_at",
            "consumed_at",
            "consumed_by",
            shown=Left(Cast(F("payload"), TextField()), PAYLOAD_SHOWN + 1),
        )[:EVENTS_SHOWN]
    )
    if not rows:
        return display.EMPTY
    cells = (
        (
            row["id"],
            cut(row["name"], MAX_EVENT_NAME),
            display.timestamp(row["sent_at"]),
            _taken(row),
            cut(row["shown"] or "null", PAYLOAD_SHOWN),
        )
        for row in rows
    )
    body = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>", cells
    )
    head = format_html(
        "<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
        gettext("id"),
        gettext("name"),
        gettext("sent"),
        gettext("taken"),
        gettext("payload"),
    )
    return format_html('<table class="dj-events">{}{}</table>', head, body)


def _taken(row: Any) -> SafeString | str:
    if row["consumed_at"] is None:
        return gettext("kept: no wait has taken it yet")
    return format_html(
        gettext("{time} by {step}"),
        time=display.timestamp(row["consumed_at"]),
        step=cut(row["consumed_by"], 255),
    )


class SendEventForm(forms.Form):
    name = forms.CharField(label=_("Event name"), max_length=MAX_EVENT_NAME)
    payload = forms.CharField(
        label=_("Payload (JSON)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        help_text=_("Empty for null. Bounded as inputs are (MAX_INPUT_BYTES)."),
    )

    def clean_name(self) -> str:
        try:
            return event_name(self.cleaned_data["name"])
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"].strip()
        if not text:
            return None
        if len(text) > conf.get().MAX_INPUT_BYTES:
            raise ValidationError(gettext("The payload is larger than MAX_INPUT_BYTES."))
        try:
            value = json.loads(text)
            to_json(value, what="the payload")
        except (ValueError, RecursionError, JobsError) as exc:
            raise ValidationError(
                gettext("Not a payload that can be sent: {error}").format(error=str(exc)[:300])
            ) from None
        return value


class SendEventMixin:
    """The run page's "Send event" button and form, for users with the change
    permission on runs (the admin otherwise changes runs only through its actions)."""

    opts: Any
    admin_site: Any

    def has_send_event_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.change_jobrun"))

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        urls = [
            path(
                "<path:object_id>/send-event/",
                self.admin_site.admin_view(self._send_event_view()),
                name="{}_{}_send_event".format(*info),
            )
        ]
        return [*urls, *super().get_urls()]  # type: ignore[misc]

    def _send_event_view(self) -> Callable[..., HttpResponse]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            if not self.has_send_event_permission(request):
                raise PermissionDenied
            run, change_url = run_of_page(self, request, object_id)
            form = SendEventForm(request.POST or None)
            if request.method == "POST" and form.is_valid():
                name = form.cleaned_data["name"]
                try:
                    send_event(run.pk, name, form.cleaned_data["payload"])
                except JobsError as exc:
                    form.add_error(None, str(exc))
                else:
                    self.log_change(request, run, f"Sent event {name!r} via the admin")  # type: ignore[attr-defined]
                    self.message_user(  # type: ignore[attr-defined]
                        request,
                        gettext("Event {name} sent to run {id}.").format(name=name, id=run.pk),
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(change_url)
            context = {
                **self.admin_site.each_context(request),
                "title": gettext("Send an event to run {id}").format(id=run.pk),
                "opts": self.opts,
                "original": run,
                "form": form,
                "change_url": change_url,
                "unfinished": run.status in UNFINISHED_STATUSES,
            }
            return TemplateResponse(request, "admin/django_jobs/jobrun/send_event.html", context)

        return view
