"""The admin's pools page: per pool, runs by status, lag, throughput and workers; pause/resume.

Pausing and resuming go through ``django_jobs.pools`` and need the
``django_jobs.pause_jobpool`` permission.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.translation import gettext

from ..pools import pause_pool, pool_problem, reason_problem, resume_pool
from ..snapshot import snapshot
from . import display

# Finished runs and runs/min on the pools page count over this span.
POOLS_WINDOW = timedelta(minutes=5)


class PoolsPageMixin:
    """Adds ``pools/`` to the runs admin (``admin:django_jobs_jobrun_pools``)."""

    admin_site: admin.AdminSite
    opts: Any

    def get_urls(self) -> list[URLPattern]:
        pools = path(
            "pools/",
            self.admin_site.admin_view(self.pools_view),
            name="django_jobs_jobrun_pools",
        )
        return [pools, *super().get_urls()]  # type: ignore[misc]

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("django_jobs.pause_jobpool"))

    def pools_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        if request.method == "POST":
            if not self.has_pause_permission(request):
                raise PermissionDenied
            self._pause_or_resume(request)
            return HttpResponseRedirect(request.path)
        shot = snapshot(window=POOLS_WINDOW, with_progress=False)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Pools"),
            "opts": self.opts,
            "pools": [
                {
                    "status": pool,
                    "oldest": _age(pool.oldest_pending),
                    "runs_per_minute": shot.runs_per_minute(pool),
                }
                for pool in shot.pools
            ],
            "window_minutes": int(POOLS_WINDOW.total_seconds() // 60),
            "can_pause": self.has_pause_permission(request),
        }
        return TemplateResponse(request, "admin/django_jobs/jobrun/pools.html", context)

    def _pause_or_resume(self, request: HttpRequest) -> None:
        name = request.POST.get("pool", "")
        operation = request.POST.get("operation")
        reason = request.POST.get("reason", "").strip()
        # What is wrong with a name or a reason is said in English, as the API's
        # exceptions say it (docs/admin.md): those come from a hand-made request.
        problem = pool_problem(name)
        if problem is not None:
            text = gettext("Pool {name} {problem}.").format(name=repr(name), problem=problem)
            self._tell(request, text, messages.ERROR)
        elif operation == "pause" and (problem := reason_problem(reason)) is not None:
            text = gettext("The pause reason {problem}.").format(problem=problem)
            self._tell(request, text, messages.ERROR)
        elif operation == "pause":
            if pause_pool(name, reason=reason):
                text = gettext("Paused pool {name}: workers stop claiming its runs.")
                self._tell(request, text.format(name=repr(name)))
            else:
                text = gettext("Pool {name} was paused already.").format(name=repr(name))
                self._tell(request, text, messages.WARNING)
        elif operation == "resume":
            if resume_pool(name):
                self._tell(request, gettext("Resumed pool {name}.").format(name=repr(name)))
            else:
                text = gettext("Pool {name} was not paused.").format(name=repr(name))
                self._tell(request, text, messages.WARNING)
        else:
            text = gettext("Unknown operation {operation}.").format(operation=repr(operation))
            self._tell(request, text, messages.ERROR)

    def _tell(self, request: HttpRequest, message: str, level: int = messages.INFO) -> None:
        self.message_user(request, message, level)  # type: ignore[attr-defined]


def _age(value: timedelta | None) -> str:
    """How long the oldest due run has waited, as the run list writes durations."""
    return display.EMPTY if value is None else display.elapsed(value.total_seconds())
