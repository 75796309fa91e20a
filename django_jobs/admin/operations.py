"""Retry, Cancel and Run now: bulk actions and buttons on the run page.

Each asks for confirmation, calls ``django_jobs.api``, reports counts with
``message_user`` and records a ``LogEntry`` per run changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.functional import Promise
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import api
from ..exceptions import JobsError
from ..models import UNSUCCESSFUL_STATUSES, JobRun, Status
from .params import an_id, run_of_page


@dataclass(frozen=True)
class Operation:
    """One operator action: its permission, wording and the api call behind it.

    ``verb``, ``explanation`` and the option's label are in the user's language;
    ``logged`` is the verb of the history entries, in English as stored records are.
    """

    name: str
    verb: str | Promise
    permission: str  # codename prefix: "<permission>_jobrun"
    explanation: str | Promise
    option: tuple[str, str | Promise, bool] | None  # (field name, label, checked by default)
    apply: Callable[[JobRun, bool], int]
    statuses: frozenset[str]  # the run statuses it changes (others are skipped)
    logged: str


OPERATIONS = {
    op.name: op
    for op in [
        Operation(
            "retry",
            _("Retry"),
            "retry",
            _(
                "Failed, timed-out and canceled runs go back to pending with fresh attempts. "
                "Completed steps replay unless you reset them. Other runs are skipped."
            ),
            ("reset_steps", _("Reset steps: completed steps run again"), False),
            lambda run, reset: int(api.retry(run.pk, reset_steps=reset) is not None),
            frozenset(UNSUCCESSFUL_STATUSES),
            "Retry",
        ),
        Operation(
            "cancel",
            _("Cancel"),
            "cancel",
            _(
                "Pending and waiting runs are canceled at once; running runs are asked to "
                "stop. Finished runs are skipped."
            ),
            ("cascade", _("Cascade: apply the children's close policies"), True),
            # The run's cancel reason is stored data, as an API caller's is: not translated.
            lambda run, cascade: api.cancel(
                run.pk, cascade=cascade, reason="canceled from the admin"
            ),
            frozenset({Status.PENDING, Status.RUNNING, Status.WAITING}),
            "Cancel",
        ),
        Operation(
            "run_now",
            _("Run now"),
            "run_now",
            _("Pending runs become due now. Other runs are skipped."),
            None,
            lambda run, flag: int(api.run_now(run.pk)),
            frozenset({Status.PENDING}),
            "Run now",
        ),
    ]
}


class OperationsMixin:
    """Adds the operations to a ModelAdmin of JobRun, as actions and as run-page buttons."""

    actions = ["retry_runs", "cancel_runs", "run_runs_now"]
    opts: Any
    admin_site: Any

    # --- permissions (custom model permissions, see JobRun.Meta.permissions) -----

    def _has(self, request: HttpRequest, operation: str) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.{operation}_jobrun"))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "retry")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "run_now")

    # --- bulk actions -------------------------------------------------------------

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[JobRun], **kwargs: Any
    ) -> Any:
        # Django 6.1 adds keyword arguments (action_location); they pass through.
        # The list posts the ticked runs' ids; anything else is a crafted request,
        # which Django's own filter on them would answer with a server error.
        if not all(an_id(pk) for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)):
            raise BadRequest("a selected run is not a run id")
        return super().response_action(request, queryset, **kwargs)  # type: ignore[misc]

    @admin.action(permissions=["retry"], description=_("Retry selected runs"))
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> HttpResponse | None:
        return self._bulk(request, queryset, OPERATIONS["retry"])

    @admin.action(permissions=["cancel"], description=_("Cancel selected runs"))
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> HttpResponse | None:
        return self._bulk(request, queryset, OPERATIONS["cancel"])

    @admin.action(permissions=["run_now"], description=_("Run selected pending runs now"))
    def run_runs_now(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> HttpResponse | None:
        return self._bulk(request, queryset, OPERATIONS["run_now"])

    def _bulk(
        self, request: HttpRequest, queryset: QuerySet[JobRun], op: Operation
    ) -> HttpResponse | None:
        if request.POST.get("confirm") == "yes":
            self._perform(request, list(queryset), op)
            return None
        # The confirmation posts the selection back: every ticked id, or, for
        # "select all across pages", the flag (the filters ride in the URL).
        across = request.POST.get("select_across") == "1"
        if across:
            # Django still wants ticked ids with the flag; the ones posted serve.
            selected = [int(pk) for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)]
        else:
            selected = list(queryset.values_list("pk", flat=True))
        return self._confirmation(
            request,
            op,
            list(queryset[:100]),
            queryset.count(),
            bulk=True,
            selected=selected,
            across=across,
        )

    # --- the buttons on a run's page ----------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        urls = [
            path(
                f"<path:object_id>/{op.name.replace('_', '-')}/",
                self.admin_site.admin_view(self._single_view(op)),
                name="{}_{}_{}".format(*info, op.name),
            )
            for op in OPERATIONS.values()
        ]
        return [*urls, *super().get_urls()]  # type: ignore[misc]

    def _single_view(self, op: Operation) -> Callable[..., HttpResponse]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            if not self._has(request, op.permission) or not self._has(request, "view"):
                raise PermissionDenied
            run, change_url = run_of_page(self, request, object_id)
            if request.method == "POST" and request.POST.get("confirm") == "yes":
                self._perform(request, [run], op)
                return HttpResponseRedirect(change_url)
            return self._confirmation(request, op, [run], 1, bulk=False)

        return view

    def run_operations(self, request: HttpRequest, run: JobRun | None) -> list[Operation]:
        """The operations this user may perform on ``run`` (the run page's buttons)."""
        return [
            op
            for op in OPERATIONS.values()
            if self._has(request, op.permission) and (run is None or run.status in op.statuses)
        ]

    # --- shared -------------------------------------------------------------------

    def _perform(self, request: HttpRequest, runs: list[JobRun], op: Operation) -> None:
        flag = False
        if op.option is not None:
            flag = request.POST.get(op.option[0]) == "on"
        changed = skipped = 0
        for run in runs:
            try:
                count = op.apply(run, flag)
            except JobsError:
                count = 0
            if count:
                changed += 1
                detail = f" ({op.option[0]})" if op.option and flag else ""
                self.log_change(request, run, f"{op.logged}{detail} via the admin")  # type: ignore[attr-defined]
            else:
                skipped += 1
        level = messages.SUCCESS if changed else messages.WARNING
        report = ngettext(
            "{verb}: {changed} run changed, {skipped} skipped.",
            "{verb}: {changed} runs changed, {skipped} skipped.",
            changed,
        ).format(verb=op.verb, changed=changed, skipped=skipped)
        self.message_user(request, report, level)  # type: ignore[attr-defined]

    def _confirmation(
        self,
        request: HttpRequest,
        op: Operation,
        runs: list[JobRun],
        total: int,
        *,
        bulk: bool,
        selected: list[int] | None = None,
        across: bool = False,
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("{verb}: are you sure?").format(verb=op.verb),
            "opts": self.opts,
            "operation": op,
            "runs": runs,
            "total": total,
            "bulk": bulk,
            "selected": selected or [],
            "select_across": "1" if across else "0",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action_name": {
                "retry": "retry_runs",
                "cancel": "cancel_runs",
                "run_now": "run_runs_now",
            }[op.name],
        }
        return TemplateResponse(request, "admin/django_jobs/jobrun/confirm_operation.html", context)
