"""The whole of a payload the run page shows cut: a JSON download, for those who may view the run.

A page renders at most ``display.SHOWN`` characters of an input, an output, an
error or a step's output; the rest of the value is here, as a file, never as
a page: the browser saves it instead of rendering it. It is the JSON text the
database holds, never decoded and encoded again.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import TextField
from django.db.models.functions import Cast
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse

from .. import conf
from ..models import JobRun, JobStep
from .params import an_id

RUN_FIELDS = ("input", "output", "error")
STEP_FIELDS = ("output", "error")


class DownloadsMixin:
    """Adds ``<run>/payload/<field>/`` and ``<run>/steps/<step>/<field>/`` to JobRunAdmin."""

    def get_urls(self) -> list[URLPattern]:
        urls = [
            path(
                "<path:object_id>/payload/<str:field>/",
                self.admin_site.admin_view(self.run_payload_view),  # type: ignore[attr-defined]
                name="django_jobs_jobrun_payload",
            ),
            path(
                "<path:object_id>/steps/<int:step>/<str:field>/",
                self.admin_site.admin_view(self.step_payload_view),  # type: ignore[attr-defined]
                name="django_jobs_jobrun_step_payload",
            ),
        ]
        return [*urls, *super().get_urls()]  # type: ignore[misc]

    def payload_url(self, run_id: int, field: str, step: int | None = None) -> str:
        name = self.admin_site.name  # type: ignore[attr-defined]
        if step is None:
            return reverse(f"{name}:django_jobs_jobrun_payload", args=[run_id, field])
        return reverse(f"{name}:django_jobs_jobrun_step_payload", args=[run_id, step, field])

    def run_payload_view(self, request: HttpRequest, object_id: str, field: str) -> HttpResponse:
        run_id = self._viewable_run(request, object_id, field, RUN_FIELDS)
        runs = JobRun.objects.using(conf.get().DATABASE).filter(pk=run_id)
        values = runs.values_list(Cast(field, TextField()))
        if not values:
            raise Http404("no such run")
        return _attachment(values[0][0], f"run-{run_id}-{field}.json")

    def step_payload_view(
        self, request: HttpRequest, object_id: str, step: int, field: str
    ) -> HttpResponse:
        run_id = self._viewable_run(request, object_id, field, STEP_FIELDS)
        if not an_id(str(step)):
            raise Http404("no such step")
        values = (
            JobStep.objects.using(conf.get().DATABASE)
            .filter(pk=step, run_id=run_id)
            .values_list(Cast(field, TextField()), flat=True)
        )
        if not values:
            raise Http404("no such step")
        return _attachment(values[0], f"run-{run_id}-step-{step}-{field}.json")

    def _viewable_run(
        self, request: HttpRequest, object_id: str, field: str, fields: tuple[str, ...]
    ) -> int:
        """The run's id, after the checks the run page itself makes (the caller
        finds the run, or answers 404)."""
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        if field not in fields or not an_id(object_id):
            raise Http404("no such value")
        return int(object_id)


def _attachment(text: str | None, filename: str) -> HttpResponse:
    """The value as the database holds its text: never decoded here, so whatever
    a row holds (a number Python cannot read back) downloads as it is stored."""
    response = HttpResponse(
        "null" if text is None else text, content_type="application/json; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
