"""A run's step timeline on its page: 50 steps a page, each previewed in the database.

Only what the table shows leaves the database: the first characters of each
step's output, and of a failed step's error its type, the first characters
of its message and traceback, and their lengths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Left, Length
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import conf
from ..models import JobRun, JobStep
from . import display, errors
from .display import EMPTY

# Steps per page of a run's step timeline (?steps=N pages through them), and
# how much of each step's output, error message or traceback the timeline shows.
STEPS_SHOWN = 50
STEP_PREVIEW = 300
STEP_ERROR_SHOWN = 4_000

COLUMNS = (
    "pk",
    "seq",
    "step_id",
    "status",
    "attempts",
    "started_at",
    "finished_at",
    "preview",
    "size",
    "error_type",
    "error_message",
    "error_message_size",
    "error_traceback",
    "error_traceback_size",
    "error_attempt",
    "error_retryable",
)


class StepTimelineMixin:
    """The ``step_timeline`` field of JobRunAdmin."""

    admin_site: Any

    payload_url: Callable[..., str]  # DownloadsMixin's

    @admin.display(description=_("steps"))
    def step_timeline(self, run: JobRun) -> SafeString | str:
        steps = JobStep.objects.using(conf.get().DATABASE).filter(run_id=run.pk)
        total = steps.count()
        if not total:
            return EMPTY
        pages = (total + STEPS_SHOWN - 1) // STEPS_SHOWN
        page = min(max(getattr(run, "steps_page", 1), 1), pages)
        start = (page - 1) * STEPS_SHOWN
        shown = [
            dict(zip(COLUMNS, values, strict=True))
            for values in _previews(steps).values_list(*COLUMNS)[start : start + STEPS_SHOWN]
        ]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    step["seq"],
                    step["step_id"],
                    display.badge(step["status"]),
                    step["attempts"],
                    display.duration(step["started_at"], step["finished_at"]),
                    self._step_result(run.pk, step),
                )
                for step in shown
            ),
        )
        headers = format_html_join(
            "",
            "<th>{}</th>",
            (
                (header,)
                for header in (
                    "#",
                    gettext("step"),
                    gettext("status"),
                    gettext("attempts"),
                    gettext("duration"),
                    gettext("output / error"),
                )
            ),
        )
        return format_html(
            '<table class="dj-steps"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>{}',
            headers,
            rows,
            self._step_pages(run.pk, page, pages, start, len(shown), total),
        )

    def _step_result(self, run_id: int, step: dict[str, Any]) -> SafeString | str:
        if step["status"] == JobStep.StepStatus.FAILED and step["error_type"] is not None:
            # An error as the run's own is recorded: shown as the run's is.
            error = errors.ShownError(
                type=step["error_type"],
                message=step["error_message"] or "",
                message_size=step["error_message_size"] or 0,
                traceback=step["error_traceback"] or "",
                traceback_size=step["error_traceback_size"] or 0,
                attempt=step["error_attempt"],
                retryable=step["error_retryable"],
            )
            whole = self.payload_url(run_id, "error", step["pk"])
            return errors.render(error, whole=whole, limit=STEP_ERROR_SHOWN)
        return self._step_preview(run_id, step)

    def _step_preview(self, run_id: int, step: dict[str, Any]) -> SafeString | str:
        preview, size = step["preview"], step["size"]
        if preview is None:
            return EMPTY
        if size is None or size <= STEP_PREVIEW:
            return format_html('<code class="dj-json">{}</code>', preview)
        if step["status"] == JobStep.StepStatus.FAILED:
            field, text = "error", gettext("whole error ({size} characters)")
        else:
            field, text = "output", gettext("whole output ({size} characters)")
        return format_html(
            '<code class="dj-json">{} …</code> <a href="{}">{}</a>',
            preview,
            self.payload_url(run_id, field, step["pk"]),
            text.format(size=display.number(size)),
        )

    def _step_pages(
        self, run_id: int, page: int, pages: int, start: int, count: int, total: int
    ) -> SafeString | str:
        if pages == 1:
            return ""
        url = reverse(f"{self.admin_site.name}:django_jobs_jobrun_change", args=[run_id])
        links = [
            format_html('<a href="{}?steps={}">{}</a>', url, number, label)
            for number, label in (
                (page - 1, gettext("earlier steps")),
                (page + 1, gettext("later steps")),
            )
            if 1 <= number <= pages
        ]
        shown = gettext("steps {first} to {last} of {total}").format(
            first=display.number(start + 1),
            last=display.number(start + count),
            total=display.number(total),
        )
        return format_html(
            '<p class="dj-step-pages">{} {}</p>',
            shown,
            format_html_join(" ", "{}", ((link,) for link in links)),
        )


def _previews(steps: Any) -> Any:
    """The steps in order, each with the cuts of its output and error the table shows."""
    cut = STEP_ERROR_SHOWN + 1  # one more, so that a cut is seen as one
    return (
        steps.order_by("seq", "id")
        .annotate(payload=Coalesce(Cast("error", TextField()), Cast("output", TextField())))
        .annotate(
            preview=Left("payload", STEP_PREVIEW),
            size=Length("payload"),
            error_type=Left(KT("error__type"), 1000),
            error_message=Left(KT("error__message"), cut),
            error_message_size=Length(KT("error__message")),
            error_traceback=Left(KT("error__traceback"), cut),
            error_traceback_size=Length(KT("error__traceback")),
            error_attempt=Left(KT("error__attempt"), 20),
            error_retryable=KT("error__retryable"),
        )
    )
