"""JobRunAdmin: the changelist and the read-only run page."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import JSONField, QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import conf
from ..models import FINISHED_STATUSES, UNFINISHED_STATUSES, JobRun, Status, Worker
from ..payloads import cut
from ..registry import all_handlers
from ..snapshot import POOLS_TEXT, PROGRESS_TEXT, pool_names, read_stored, text_of
from ..storage import vendors
from . import display, events, waits
from .display import EMPTY
from .downloads import DownloadsMixin
from .events import SendEventMixin
from .labels import FieldLabels
from .operations import OperationsMixin
from .params import CheckedChangeList, an_id
from .pools import PoolsPageMixin
from .summary import RunSummaryMixin
from .timeline import StepTimelineMixin

# Children listed on a run's page; the rest are a filtered run list away.
CHILDREN_SHOWN = 50
# Pools the pool filter lists at most (a worker row may name thousands).
POOLS_OFFERED = 200
# Characters of a running run's progress the run list shows under its status.
LIST_PROGRESS = 60

# Django never decodes a run's JSON column in this admin: one row holding JSON
# Python cannot read back (a number of 5,001 digits, 10,000 levels of nesting)
# would fail the whole page. What a page shows of them is read as text and
# decoded by ``read_stored``, which marks what it cannot read.
JSON_COLUMNS = tuple(f.name for f in JobRun._meta.concrete_fields if isinstance(f, JSONField))
# The JSON columns the run page shows (trace_context is never read).
PAGE_JSON = ("input", "output", "error", "progress", "tags", "worker_ids", "awaiting")
# The rest of the run, and what the page shows of its parent, root and worker.
PAGE_COLUMNS = (
    *(f.name for f in JobRun._meta.concrete_fields if not isinstance(f, JSONField)),
    *(f"{rel}__{name}" for rel in ("parent", "root") for name in ("id", "job_type", "status")),
    *(f"claimed_by__{name}" for name in ("id", "hostname", "pid", "status")),
)


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Use the database's row estimate for the unfiltered changelist of a large table.

    A ``COUNT(*)`` over millions of runs on every page load is what makes an
    admin slow; a filtered changelist still counts exactly.
    """

    @cached_property
    def count(self) -> int:
        query = self.object_list
        if isinstance(query, QuerySet) and not query.query.where:
            connection = connections[query.db]
            estimate = vendors.of(connection).estimated_rows(connection, query.model._meta.db_table)
            if estimate is not None and estimate > 100_000:
                return estimate
        return super().count


class ExactFilter(admin.SimpleListFilter):
    """A list filter on one column's exact value; subclasses say which values to offer."""

    field = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class JobTypeFilter(ExactFilter):
    title = _("job type")
    parameter_name = field = "job_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # From the registry, not a DISTINCT over the whole table.
        return [(name, name) for name in sorted(all_handlers())]


class PoolFilter(ExactFilter):
    title = _("pool")
    parameter_name = field = "pool"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        pools = {handler.pool for handler in all_handlers().values()}
        # Read as text: a worker row whose pools cannot be read offers none.
        workers = Worker.objects.using(conf.get().DATABASE).values_list(
            "pk", text_of("pools", POOLS_TEXT)
        )
        for pk, text in workers[:500]:
            served = pool_names(read_stored(text, f"worker={pk} pools", POOLS_TEXT))
            if isinstance(served, list):
                pools.update(served)
        return [(name, name) for name in sorted(pools)[:POOLS_OFFERED]]


class TenantFilter(ExactFilter):
    title = _("tenant")
    parameter_name = "tenant"
    field = "tenant_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tenants = (
            JobRun.objects.using(conf.get().DATABASE)
            .filter(tenant_id__isnull=False)
            .order_by("tenant_id")
            .values_list("tenant_id", flat=True)
            .distinct()[:100]
        )
        return [(t, t) for t in tenants if t is not None]


class JobRunAdmin(  # type: ignore[misc]
    RunSummaryMixin,
    StepTimelineMixin,
    DownloadsMixin,
    PoolsPageMixin,
    OperationsMixin,
    SendEventMixin,
    CheckedChangeList,
    FieldLabels,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    field_labels = {
        "id": _("id"),
        "job_type": _("job type"),
        "status": _("status"),
        "pool": _("pool"),
        "priority": _("priority"),
        "tenant_id": _("tenant"),
        "tags": _("tags"),
        "concurrency_key": _("concurrency key"),
        "concurrency_limit": _("concurrency limit"),
        "idempotency_key": _("idempotency key"),
        "created_at": _("created"),
        "cancel_reason": _("cancel reason"),
        "close_policy": _("close policy"),
        "lease_token": _("lease token"),
    }
    # Fits a 1,400 px window beside the filters: one timestamp and a duration,
    # not three timestamps; progress under the status; the priority is on the run page.
    list_display = [
        "id",
        "job_type",
        "status_list",
        "pool",
        "attempts_display",
        "created",
        "duration",
    ]
    list_display_links = ["id", "job_type"]
    list_filter = ["status", PoolFilter, JobTypeFilter, TenantFilter, "created_at"]
    # The lookups the list filters make. Django would accept any lookup on the
    # run's own columns from a query string (a regex over tenants, a probe into
    # inputs); only these are let through.
    allowed_lookups = frozenset(
        {"status", "status__exact", "created_at__gte", "created_at__lt", "parent"}
        | {f.parameter_name for f in (PoolFilter, JobTypeFilter, TenantFilter)}
    )

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.allowed_lookups

    search_help_text = _("A run id, a job type, an idempotency key, or tag:NAME (exact matches).")
    search_fields = ["job_type"]  # enables the box; get_search_results does the work
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # per-filter COUNTs are too dear on a big table
    paginator = EstimatedCountPaginator
    change_form_template = "admin/django_jobs/jobrun/change_form.html"
    change_list_template = "admin/django_jobs/jobrun/change_list.html"
    # The summary (RunSummaryMixin, at the top of the page) has what an operator
    # reads first: status, error, attempts, times, worker. Every field follows.
    fieldsets = [
        (
            _("Run"),
            {
                "fields": [
                    "id",
                    "job_type",
                    "status_badge",
                    "pool",
                    "priority",
                    "attempts_display",
                    "tenant_id",
                    "tag_list",
                    "concurrency_key",
                    "concurrency_limit",
                    "waits_for",
                    "idempotency_key",
                    "options_in_force",
                ]
            },
        ),
        (
            _("Times"),
            {
                "fields": [
                    "created",
                    "due",
                    "started",
                    "finished",
                    "duration_detail",
                    "progress_display",
                    "cancel_requested",
                    "cancel_reason_shown",
                ]
            },
        ),
        (_("Data"), {"fields": ["input_pretty", "output_pretty"]}),
        (_("Steps"), {"fields": ["step_timeline"]}),
        (_("Events"), {"fields": ["event_list"]}),
        (
            _("Family"),
            {
                "fields": [
                    "parent_link",
                    "root_link",
                    "children_links",
                    "close_policy",
                    "trigger",
                ]
            },
        ),
        (_("Worker"), {"fields": ["worker_link", "lease_token", "attempt_workers"]}),
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [str(f) for _, options in self.fieldsets for f in options["fields"]]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # runs change only through the actions (django_jobs.api)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # finished runs are pruned in batches, not from a form

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobRun]:
        queryset: QuerySet[JobRun] = super().get_queryset(request)
        queryset = queryset.using(conf.get().DATABASE).defer(*JSON_COLUMNS)
        if getattr(request, "_django_jobs_list", False):
            # The list shows a running run's progress, read as text, and no
            # payload nor reason: those never leave the database there.
            queryset = queryset.defer("cancel_reason").annotate(
                progress_text=text_of("progress", PROGRESS_TEXT)
            )
        return queryset

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        request._django_jobs_list = True  # type: ignore[attr-defined]
        try:
            return super().get_changelist_instance(request)
        finally:
            request._django_jobs_list = False  # type: ignore[attr-defined]

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if not an_id(object_id):
            return None
        texts = {f"{name}_text": Cast(name, TextField()) for name in PAGE_JSON}
        texts["progress_text"] = text_of("progress", PROGRESS_TEXT)
        queryset = (
            self.get_queryset(request)
            .select_related("parent", "root", "claimed_by")
            .only(*PAGE_COLUMNS)
            .annotate(**texts)
        )
        try:
            run = queryset.get(pk=int(object_id))
        except JobRun.DoesNotExist:
            return None
        for name in PAGE_JSON:
            limit = PROGRESS_TEXT if name == "progress" else None
            value = read_stored(getattr(run, f"{name}_text"), f"run={run.pk} {name}", limit)
            setattr(run, name, value)
        # Which page of the step timeline to show: the field's method sees only the run.
        page = request.GET.get("steps", "1")
        number = int(page) if page.isascii() and page.isdigit() and len(page) < 9 else 1
        run.steps_page = number  # type: ignore[attr-defined]
        return run

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobRun], search_term: str
    ) -> tuple[QuerySet[JobRun], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if "\0" in term:
            # No run holds a NUL (PostgreSQL cannot even compare one): Django's
            # autocomplete view searches with this method too, unchecked.
            return queryset.none(), False
        # Each shape of term gets one cheap lookup, not an OR that scans the table.
        if term.isascii() and term.isdigit() and len(term) < 19:
            return queryset.filter(pk=int(term)), False
        if term.startswith("tag:"):
            return queryset.filter(tags__contains=[term[4:]]), False
        from django.db.models import Q

        return queryset.filter(Q(job_type=term) | Q(idempotency_key=term)), False

    # --- columns ------------------------------------------------------------------

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, run: JobRun) -> SafeString:
        return display.badge(run.status)

    @admin.display(description=_("attempts"), ordering="attempts")
    def attempts_display(self, run: JobRun) -> str:
        return f"{run.attempts}/{run.max_attempts}"

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, run: JobRun) -> SafeString | str:
        return display.timestamp(run.created_at)

    @admin.display(description=_("duration"))
    def duration(self, run: JobRun) -> str:
        """From creation to end: a whole life, waits for children and retries included."""
        if run.status in FINISHED_STATUSES:
            return display.duration(run.created_at, run.finished_at)
        if run.status == Status.RUNNING:
            return display.so_far(display.duration(run.created_at, timezone.now()))
        return EMPTY

    @admin.display(description=_("status"), ordering="status")
    def status_list(self, run: JobRun) -> SafeString:
        """The badge, and under it an unfinished run's progress (a finished run's
        last report is history: on its page only, labelled)."""
        if run.status in FINISHED_STATUSES:
            progress = EMPTY
        else:
            stored = getattr(run, "progress_text", None)
            value = read_stored(stored, f"run={run.pk} progress", PROGRESS_TEXT)
            progress = display.progress(value)
        if progress == EMPTY:
            return display.badge(run.status)
        if len(progress) > LIST_PROGRESS:
            progress = progress[: LIST_PROGRESS - 1] + "…"
        return format_html(
            '{}<br><small class="dj-progress" style="display:inline-block;max-width:10em">'
            "{}</small>",
            display.badge(run.status),
            progress,
        )

    # --- the run page -------------------------------------------------------------

    @admin.display(description=_("input"))
    def input_pretty(self, run: JobRun) -> SafeString:
        return display.pretty_json(run.input, whole=self.payload_url(run.pk, "input"))

    @admin.display(description=_("output"))
    def output_pretty(self, run: JobRun) -> SafeString | str:
        if run.output is None:
            return EMPTY
        return display.pretty_json(run.output, whole=self.payload_url(run.pk, "output"))

    @admin.display(description=_("parent"))
    def parent_link(self, run: JobRun) -> SafeString | str:
        return EMPTY if run.parent is None else display.run_label(run.parent)

    @admin.display(description=_("root"))
    def root_link(self, run: JobRun) -> SafeString | str:
        return EMPTY if run.root is None else display.run_label(run.root)

    @admin.display(description=_("children"))
    def children_links(self, run: JobRun) -> SafeString | str:
        children = list(
            JobRun.objects.using(conf.get().DATABASE)
            .filter(parent_id=run.pk)
            .only("id", "job_type", "status")
            .order_by("id")[: CHILDREN_SHOWN + 1]
        )
        if not children:
            return EMPTY
        items = format_html_join(
            "", "<li>{}</li>", ((display.run_label(c),) for c in children[:CHILDREN_SHOWN])
        )
        more = ""
        if len(children) > CHILDREN_SHOWN:
            url = reverse(f"{self.admin_site.name}:django_jobs_jobrun_changelist")
            more = format_html(
                "<li>{}</li>",
                format_html(
                    gettext('the first {count} are shown: <a href="{url}">all of them</a>'),
                    count=CHILDREN_SHOWN,
                    url=f"{url}?parent={run.pk}",
                ),
            )
        return format_html('<ul style="margin:0;padding-left:1em">{}{}</ul>', items, more)

    @admin.display(description=_("waits for"))
    def waits_for(self, run: JobRun) -> SafeString | str:
        """What keeps a pending run from running (``admin.waits``), or the event a
        waiting run waits for (``admin.events``)."""
        return waits.waits_for(run) or events.waiting_for_event(run) or EMPTY

    @admin.display(description=_("options from settings"))
    def options_in_force(self, run: JobRun) -> SafeString | str:
        return display.job_options(run.job_type)

    @admin.display(description=_("events"))
    def event_list(self, run: JobRun) -> SafeString | str:
        return events.event_list(run)

    @admin.display(description=_("trigger"))
    def trigger(self, run: JobRun) -> str:
        return f"{run.trigger_source} {run.trigger_ref}".strip()

    @admin.display(description=_("workers by attempt"))
    def attempt_workers(self, run: JobRun) -> str:
        return display.listed(run.worker_ids, lambda n, worker: f"{n}: {worker}")

    @admin.display(description=_("tags"))
    def tag_list(self, run: JobRun) -> str:
        return display.listed(run.tags)

    @admin.display(description=_("cancel reason"))
    def cancel_reason_shown(self, run: JobRun) -> str:
        return cut(run.cancel_reason, display.REASON_SHOWN) or EMPTY

    # --- extra pages --------------------------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        run = self.get_object(request, object_id)
        extra = {
            **(extra_context or {}),
            "run_operations": self.run_operations(request, run),
            "can_send_event": run is not None
            and run.status in UNFINISHED_STATUSES
            and self.has_send_event_permission(request),
        }
        if run is not None:
            extra["run_summary"] = self.run_summary(run)
        return super().change_view(request, object_id, form_url, extra)
