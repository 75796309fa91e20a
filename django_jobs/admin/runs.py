"""JobRunAdmin: the changelist and the read-only run page."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast, Coalesce, Left, Length
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import conf
from ..models import JobRun, JobStep, Worker
from ..registry import all_handlers
from . import display
from .display import EMPTY
from .downloads import DownloadsMixin
from .operations import OperationsMixin
from .pools import PoolsPageMixin

# Children listed on a run's page; the rest are a filtered run list away.
CHILDREN_SHOWN = 50
# Steps per page of a run's step timeline (?steps=N pages through them), and
# how much of each step's output or error the timeline shows.
STEPS_SHOWN = 50
STEP_PREVIEW = 300


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Use PostgreSQL's row estimate for the unfiltered changelist of a large table.

    A ``COUNT(*)`` over millions of runs on every page load is what makes an
    admin slow; a filtered changelist still counts exactly.
    """

    @cached_property
    def count(self) -> int:
        query = self.object_list
        if isinstance(query, QuerySet) and not query.query.where:
            connection = connections[query.db]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                        [query.model._meta.db_table],
                    )
                    row = cursor.fetchone()
                if row is not None and row[0] > 100_000:
                    return int(row[0])
        return super().count


class ExactFilter(admin.SimpleListFilter):
    """A list filter on one column's exact value; subclasses say which values to offer."""

    field = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class JobTypeFilter(ExactFilter):
    title = "job type"
    parameter_name = field = "job_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # From the registry, not a DISTINCT over the whole table.
        return [(name, name) for name in sorted(all_handlers())]


class PoolFilter(ExactFilter):
    title = "pool"
    parameter_name = field = "pool"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        pools = {handler.pool for handler in all_handlers().values()}
        for worker_pools in Worker.objects.using(conf.get().DATABASE).values_list(
            "pools", flat=True
        )[:500]:
            pools.update(worker_pools or [])
        return [(name, name) for name in sorted(pools)]


class TenantFilter(ExactFilter):
    title = "tenant"
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


class JobRunAdmin(DownloadsMixin, PoolsPageMixin, OperationsMixin, admin.ModelAdmin):  # type: ignore[type-arg,misc]
    list_display = [
        "id",
        "job_type",
        "status_badge",
        "pool",
        "priority",
        "attempts_display",
        "created_at",
        "started_at",
        "finished_at",
        "duration",
        "progress_display",
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

    search_help_text = "A run id, a job type, an idempotency key, or tag:NAME (exact matches)."
    search_fields = ["job_type"]  # enables the box; get_search_results does the work
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # per-filter COUNTs are too dear on a big table
    paginator = EstimatedCountPaginator
    change_form_template = "admin/django_jobs/jobrun/change_form.html"
    change_list_template = "admin/django_jobs/jobrun/change_list.html"
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "job_type",
                    "status_badge",
                    "pool",
                    "priority",
                    "attempts_display",
                    "tenant_id",
                    "tags",
                    "concurrency_key",
                    "idempotency_key",
                ]
            },
        ),
        (
            "Times",
            {
                "fields": [
                    "created_at",
                    "run_at",
                    "started_at",
                    "finished_at",
                    "duration",
                    "progress_display",
                    "cancel_requested_at",
                    "cancel_reason",
                ]
            },
        ),
        ("Data", {"fields": ["input_pretty", "output_pretty", "error_summary", "traceback"]}),
        ("Steps", {"fields": ["step_timeline"]}),
        (
            "Family",
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
        ("Worker", {"fields": ["worker_link", "lease_token", "attempt_workers"]}),
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
        if getattr(request, "_django_jobs_list", False):
            # The list shows none of the payloads: never load (or decode) them there.
            queryset = queryset.defer("input", "output", "error")
        return queryset.using(conf.get().DATABASE)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        request._django_jobs_list = True  # type: ignore[attr-defined]
        try:
            return super().get_changelist_instance(request)
        finally:
            request._django_jobs_list = False  # type: ignore[attr-defined]

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        queryset = self.get_queryset(request).select_related("parent", "root", "claimed_by")
        if not (object_id.isascii() and object_id.isdigit() and len(object_id) <= 18):
            return None
        try:
            run = queryset.get(pk=int(object_id))
        except JobRun.DoesNotExist:
            return None
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
        # Each shape of term gets one cheap lookup, not an OR that scans the table.
        if term.isascii() and term.isdigit() and len(term) < 19:
            return queryset.filter(pk=int(term)), False
        if term.startswith("tag:"):
            return queryset.filter(tags__contains=[term[4:]]), False
        from django.db.models import Q

        return queryset.filter(Q(job_type=term) | Q(idempotency_key=term)), False

    # --- columns ------------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: JobRun) -> SafeString:
        return display.badge(run.status)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, run: JobRun) -> str:
        return f"{run.attempts}/{run.max_attempts}"

    @admin.display(description="duration")
    def duration(self, run: JobRun) -> str:
        return display.duration(run.started_at, run.finished_at)

    @admin.display(description="progress")
    def progress_display(self, run: JobRun) -> str:
        return display.progress(run.progress)

    # --- the run page -------------------------------------------------------------

    @admin.display(description="input")
    def input_pretty(self, run: JobRun) -> SafeString:
        return display.pretty_json(run.input, whole=self.payload_url(run.pk, "input"))

    @admin.display(description="output")
    def output_pretty(self, run: JobRun) -> SafeString | str:
        if run.output is None:
            return EMPTY
        return display.pretty_json(run.output, whole=self.payload_url(run.pk, "output"))

    @admin.display(description="error")
    def error_summary(self, run: JobRun) -> SafeString | str:
        if not isinstance(run.error, dict) or not run.error:
            return EMPTY
        message = run.error.get("message", "")
        message = message if isinstance(message, str) else ""
        note = ""
        if len(message) > display.SHOWN:  # stored before messages were capped
            note = display.truncated(
                len(message), self.payload_url(run.pk, "error"), unit="characters"
            )
            message = message[: display.SHOWN]
        return format_html(
            "<strong>{}</strong>: {} <small>(attempt {})</small>{}",
            str(run.error.get("type", ""))[:1000],
            message,
            str(run.error.get("attempt", "?"))[:20],
            note,
        )

    @admin.display(description="traceback")
    def traceback(self, run: JobRun) -> SafeString | str:
        text = run.error.get("traceback") if isinstance(run.error, dict) else None
        if not text or not isinstance(text, str):
            return EMPTY
        return display.preformatted(text, whole=self.payload_url(run.pk, "error"))

    @admin.display(description="steps")
    def step_timeline(self, run: JobRun) -> SafeString | str:
        steps = JobStep.objects.using(conf.get().DATABASE).filter(run_id=run.pk)
        total = steps.count()
        if not total:
            return EMPTY
        pages = (total + STEPS_SHOWN - 1) // STEPS_SHOWN
        page = min(max(getattr(run, "steps_page", 1), 1), pages)
        start = (page - 1) * STEPS_SHOWN
        # Only what the table shows leaves the database: a preview of each
        # output or error and its length, never the whole value.
        shown = list(
            steps.order_by("seq", "id")
            .annotate(
                payload=Coalesce(Cast("error", TextField()), Cast("output", TextField())),
            )
            .annotate(preview=Left("payload", STEP_PREVIEW), size=Length("payload"))
            .values_list(
                "pk",
                "seq",
                "step_id",
                "status",
                "attempts",
                "started_at",
                "finished_at",
                "preview",
                "size",
            )[start : start + STEPS_SHOWN]
        )
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    seq,
                    step_id,
                    display.badge(status),
                    attempts,
                    display.duration(started, finished),
                    self._step_preview(run.pk, pk, status, preview, size),
                )
                for pk, seq, step_id, status, attempts, started, finished, preview, size in shown
            ),
        )
        return format_html(
            '<table class="dj-steps"><thead><tr><th>#</th><th>step</th><th>status</th>'
            "<th>attempts</th><th>duration</th><th>output / error</th></tr></thead>"
            "<tbody>{}</tbody></table>{}",
            rows,
            self._step_pages(run.pk, page, pages, start, len(shown), total),
        )

    def _step_preview(
        self, run_id: int, step: int, status: str, preview: str | None, size: int | None
    ) -> SafeString | str:
        if preview is None:
            return EMPTY
        if size is None or size <= STEP_PREVIEW:
            return format_html('<code class="dj-json">{}</code>', preview)
        field = "error" if status == JobStep.StepStatus.FAILED else "output"
        return format_html(
            '<code class="dj-json">{} …</code> <a href="{}">whole {} ({} characters)</a>',
            preview,
            self.payload_url(run_id, field, step),
            field,
            f"{size:,}",
        )

    def _step_pages(
        self, run_id: int, page: int, pages: int, start: int, count: int, total: int
    ) -> SafeString | str:
        if pages == 1:
            return ""
        url = reverse(f"{self.admin_site.name}:django_jobs_jobrun_change", args=[run_id])
        links = [
            format_html('<a href="{}?steps={}">{} steps</a>', url, number, label)
            for number, label in ((page - 1, "earlier"), (page + 1, "later"))
            if 1 <= number <= pages
        ]
        return format_html(
            '<p class="dj-step-pages">steps {} to {} of {} {}</p>',
            f"{start + 1:,}",
            f"{start + count:,}",
            f"{total:,}",
            format_html_join(" ", "{}", ((link,) for link in links)),
        )

    @admin.display(description="parent")
    def parent_link(self, run: JobRun) -> SafeString | str:
        return EMPTY if run.parent is None else display.run_label(run.parent)

    @admin.display(description="root")
    def root_link(self, run: JobRun) -> SafeString | str:
        return EMPTY if run.root is None else display.run_label(run.root)

    @admin.display(description="children")
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
                '<li>the first {} are shown: <a href="{}?parent={}">all of them</a></li>',
                CHILDREN_SHOWN,
                url,
                run.pk,
            )
        return format_html('<ul style="margin:0;padding-left:1em">{}{}</ul>', items, more)

    @admin.display(description="trigger")
    def trigger(self, run: JobRun) -> str:
        return f"{run.trigger_source} {run.trigger_ref}".strip()

    @admin.display(description="workers by attempt")
    def attempt_workers(self, run: JobRun) -> str:
        return ", ".join(f"{n}: {worker}" for n, worker in enumerate(run.worker_ids, 1)) or EMPTY

    @admin.display(description="worker")
    def worker_link(self, run: JobRun) -> SafeString | str:
        worker = run.claimed_by
        if worker is None:
            return EMPTY
        url = reverse("admin:django_jobs_worker_change", args=[worker.pk])
        return format_html('<a href="{}">{}</a> ({})', url, str(worker), worker.status)

    # --- extra pages --------------------------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        run = self.get_object(request, object_id)
        extra = {**(extra_context or {}), "run_operations": self.run_operations(request, run)}
        return super().change_view(request, object_id, form_url, extra)
