"""The top of a run's page: what an operator reads first, then the times and the worker.

Status, error, attempts, times, duration and worker sit in one short table
above the long field list. A finished run's last progress report and last
worker are labelled as such, never shown as if they were current.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..models import FINISHED_STATUSES, NO_DEADLINE, UNSUCCESSFUL_STATUSES, JobRun, Status
from ..payloads import Unreadable, cut
from . import display, errors, events
from .display import EMPTY


class RunSummaryMixin:
    """The summary of JobRunAdmin's run page, and the run page's time and worker fields."""

    payload_url: Callable[..., str]  # DownloadsMixin's

    def run_summary(self, run: JobRun) -> SafeString:
        finished = run.status in FINISHED_STATUSES
        attempts = gettext("{used} of {allowed}").format(
            used=run.attempts, allowed=run.max_attempts
        )
        rows = [
            (gettext("status"), self._state(run)),
            (gettext("attempts"), attempts),
            (_error_label(run), self._error(run)),
            (gettext("times"), self._times(run)),
            (gettext("duration"), self.duration_detail(run)),
            (gettext("worker"), self.worker_link(run)),
            # A finished run's last report is on the field list, labelled.
            (gettext("progress"), EMPTY if finished else display.progress(run.progress)),
            (
                gettext("parent"),
                EMPTY if run.parent is None else display.run_label(run.parent),
            ),
        ]
        return format_html(
            '<fieldset class="module dj-summary"><h2 class="fieldset-heading">{}</h2>'
            "<table><tbody>{}</tbody></table></fieldset>",
            gettext("Summary"),
            format_html_join(
                "",
                '<tr><th scope="row">{}</th><td>{}</td></tr>',
                ((label, value) for label, value in rows if value != EMPTY),
            ),
        )

    def _state(self, run: JobRun) -> SafeString:
        note: SafeString | str = ""
        if run.status == Status.PENDING:
            due = run.run_at is not None and run.run_at > timezone.now()
            note = (
                format_html(gettext("due {time}"), time=display.timestamp(run.run_at))
                if due
                else gettext("due now")
            )
        elif run.status == Status.WAITING and run.awaiting_event:
            note = events.waiting_for_event(run) or ""
        elif run.status == Status.WAITING:
            note = (
                gettext("waiting for its child runs")
                if run.awaiting is not None
                else format_html(
                    gettext("sleeping until {time}"), time=display.timestamp(run.run_at)
                )
            )
        if run.cancel_requested_at is not None and run.status not in FINISHED_STATUSES:
            note = format_html(
                "{}{}",
                format_html("{}; ", note) if note else "",
                format_html(
                    gettext("cancel requested {time}"),
                    time=display.timestamp(run.cancel_requested_at),
                ),
            )
        if run.cancel_reason:
            reason = cut(run.cancel_reason, display.REASON_SHOWN)
            note = format_html("{}{}", format_html("{}; ", note) if note else "", reason)
        return format_html("{} {}", display.badge(run.status), note)

    def _error(self, run: JobRun) -> SafeString | str:
        if isinstance(run.error, Unreadable):
            return display.unreadable(run.error, whole=self.payload_url(run.pk, "error"))
        shown = errors.ShownError.of(run.error)
        if shown is None:
            return EMPTY
        return errors.render(shown, whole=self.payload_url(run.pk, "error"), traceback_open=True)

    def _times(self, run: JobRun) -> SafeString:
        parts = [
            (gettext("created {time}"), run.created_at),
            (gettext("last execution started {time}"), run.started_at),
            (gettext("finished {time}"), run.finished_at),
        ]
        return format_html_join(
            " · ",
            "{}",
            (
                (format_html(text, time=display.timestamp(value)),)
                for text, value in parts
                if value is not None
            ),
        )

    # --- fields of the run page ---------------------------------------------------

    @admin.display(description=_("run at"))
    def due(self, run: JobRun) -> SafeString | str:
        if run.awaiting_event and run.run_at is not None and run.run_at >= NO_DEADLINE:
            return gettext("no deadline")
        return display.timestamp(run.run_at)

    @admin.display(description=_("started at (latest execution)"))
    def started(self, run: JobRun) -> SafeString | str:
        return display.timestamp(run.started_at)

    @admin.display(description=_("finished at"))
    def finished(self, run: JobRun) -> SafeString | str:
        return display.timestamp(run.finished_at)

    @admin.display(description=_("cancel requested at"))
    def cancel_requested(self, run: JobRun) -> SafeString | str:
        return display.timestamp(run.cancel_requested_at)

    @admin.display(description=_("duration"))
    def duration_detail(self, run: JobRun) -> str:
        """The whole life from creation, and the latest execution alone.

        ``started_at`` is set at each execution: a parent resumed after its
        children ran, or a run retried, started again. Its whole life is counted
        from its creation (waiting in the queue included), not from that start.
        """
        finished = run.status in FINISHED_STATUSES
        if not finished and run.status != Status.RUNNING:
            return EMPTY
        end = run.finished_at if finished else timezone.now()
        whole = display.duration(run.created_at, end)
        if whole == EMPTY:
            return EMPTY
        if finished:
            text = gettext("{duration} from creation to end").format(duration=whole)
        else:
            text = display.so_far(whole)
        last = display.duration(run.started_at, end)
        if last != EMPTY and last != whole:
            latest = gettext("latest execution {duration}").format(duration=last)
            text = f"{text} · {latest}"
        return text

    @admin.display(description=_("progress"))
    def progress_display(self, run: JobRun) -> str:
        text = display.progress(run.progress)
        if text != EMPTY and run.status in FINISHED_STATUSES:
            return gettext("{progress} (its last report, before the run ended)").format(
                progress=text
            )
        return text

    @admin.display(description=_("worker"))
    def worker_link(self, run: JobRun) -> SafeString | str:
        worker = run.claimed_by
        if worker is None:
            return EMPTY
        url = reverse("admin:django_jobs_worker_change", args=[worker.pk])
        if run.status == Status.RUNNING:
            role = gettext("holds it now; the worker is {status}").format(
                status=worker.get_status_display().lower()
            )
        else:
            role = gettext("ran its last attempt")
        return format_html('<a href="{}">{}</a> ({})', url, str(worker), role)


def _error_label(run: JobRun) -> str:
    """ "error" for a run that ended with it; "last error" for one that carries on
    (a retry is due) or completed after it."""
    return gettext("error") if run.status in UNSUCCESSFUL_STATUSES else gettext("last error")
