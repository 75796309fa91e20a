"""Every field a caller or a handler can fill, filled with the worst at once (issue 16),
and rows no caller could write, with crafted requests (issue 32).

The budget, per admin page and per command: at most ``PAGE_BUDGET`` bytes of
output and ``QUERY_BUDGET`` queries, whatever the runs hold; nothing a payload
holds reaches the page unescaped or the terminal as a control character. Time
is not asserted here (machines are shared and noisy): the work a page may do is
bounded by what it may load and print, and ``bench/admin_1m.py`` times the pages.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import cancel, start
from django_jobs.context import progress_record
from django_jobs.errors import error_record
from django_jobs.models import JobPool, JobRun, JobStep, Status, Worker
from django_jobs.payloads import MAX_DEPTH, normalize

pytestmark = pytest.mark.django_db

PAGE_BUDGET = 1_000_000  # bytes; before the caps one run page weighed 405 MB
QUERY_BUDGET = 40

# Markup, terminal escapes (a title change, a screen clear, colour), a
# right-to-left override and an entity: what an attacker would put in a name.
EVIL = "<script>alert(1)</script>\x1b]0;owned\x07\x1b[2J\x1b[1;31mFAKE\u202e&amp;"
# The same text with its control characters gone, as the API stores it.
PRINTABLE_EVIL = "".join(c if c.isprintable() else " " for c in EVIL)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth - 1):
        leaf = [leaf]
    return leaf


def deep(size: int) -> Any:
    """About ``size`` bytes of JSON nested near MAX_DEPTH, with hostile leaves."""
    one = nested(MAX_DEPTH - 10, EVIL)
    return {EVIL: [one] * (size // 480)}


class HandlerFailure(Exception):
    pass


@pytest.fixture
def hostile() -> JobRun:
    """A parent run and its family, with every field at the worst the API allows,
    and errors as large as a handler can raise."""
    run = start(
        "tests.noop",
        deep(1_000_000),
        tags=[(EVIL * 4)[:100] for _ in range(50)],
        tenant_id=(EVIL * 4)[:100],
        idempotency_key=(EVIL * 10)[:255],
    )
    for n in range(120):
        child = start(
            "tests.noop", {"n": n}, parent=run.pk, tenant_id=run.tenant_id, tags=[EVIL[:100]]
        )
        if n % 3 == 0:
            cancel(child.pk, reason=(PRINTABLE_EVIL * 100)[:1000])
    failure = error_record(HandlerFailure(EVIL * 200_000), 1, retryable=False)
    JobRun.objects.filter(pk=run.pk).update(
        status=Status.FAILED,
        attempts=1,
        output=normalize(deep(1_000_000), what="output"),
        error=failure,
        progress=progress_record(10**15, 10**15, EVIL * 100),
        worker_ids=[EVIL[:36]] * 3,
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    small_failure = error_record(HandlerFailure(EVIL * 10), 1, retryable=False)
    big_output = normalize({"out": EVIL * 200}, what="step")
    JobStep.objects.bulk_create(
        (
            JobStep(
                run_id=run.pk,
                step_id=f"{EVIL}{n}"[:255],
                seq=n,
                status="completed" if n % 2 else "failed",
                output=big_output if n % 2 else None,
                # The largest a step error can be, now and then; a short one otherwise.
                error=None if n % 2 else (failure if n % 1000 == 0 else small_failure),
            )
            for n in range(20_000)
        ),
        batch_size=500,  # within MariaDB's largest statement (max_allowed_packet)
    )
    Worker.objects.create(hostname=EVIL, pid=1, pools=["default"] * 100, concurrency=4)
    JobPool.objects.create(name="default", paused_at=timezone.now(), pause_reason=EVIL)
    return JobRun.objects.get(pk=run.pk)


def store(pk: int, column: str, text: str) -> None:
    """Write JSON ``text`` into a run's column as it is: the ORM could not encode it,
    and MariaDB's CHECK (JSON_VALID) refuses nesting past 32 levels."""
    table = connection.ops.quote_name("django_jobs_jobrun")
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    checks = "SET SESSION check_constraint_checks = {}" if connection.vendor == "mysql" else ""
    with connection.cursor() as cursor:
        if checks:
            cursor.execute(checks.format(0))
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name(column)} = %s{cast} WHERE id = %s",
            [text, pk],
        )
        if checks:
            cursor.execute(checks.format(1))


@pytest.fixture
def forged(hostile: JobRun) -> list[JobRun]:
    """Rows no caller of the API could write, beside the hostile family (issue 32):
    a progress of a 5,001-digit number, one whose date is no date, JSON nested
    10,000 deep, 200,000 tags and worker ids, reasons of megabytes, a worker
    serving 200,000 pools."""
    huge = "1" + "0" * 5_000
    runs = [start("tests.noop", {}) for _ in range(4)]
    running = {"status": Status.RUNNING, "attempts": 1, "started_at": timezone.now()}
    JobRun.objects.filter(pk__in=[r.pk for r in runs[:2]]).update(**running)
    store(runs[0].pk, "progress", f'{{"done": {huge}, "total": 3, "message": "{huge}"}}')
    store(runs[0].pk, "input", f'{{"n": {huge}}}')
    store(runs[0].pk, "error", "[" * 10_000 + "]" * 10_000)
    JobRun.objects.filter(pk=runs[1].pk).update(
        progress={"done": 1, "total": 2, "message": EVIL, "at": "2026-13-45T99:99:99"}
    )
    # One column a statement: within MariaDB's largest (max_allowed_packet, 16 MB).
    forged_run = JobRun.objects.filter(pk=runs[2].pk)
    forged_run.update(status=Status.CANCELED, tags=[EVIL[:16]] * 200_000)
    forged_run.update(worker_ids=[PRINTABLE_EVIL[:36]] * 200_000)
    forged_run.update(cancel_reason=PRINTABLE_EVIL * 50_000)
    store(runs[3].pk, "trace_context", f'{{"n": {huge}}}')
    store(runs[3].pk, "awaiting", "[" * 10_000 + "]" * 10_000)
    Worker.objects.create(
        hostname="forged", pid=2, pools=[f"p{n}" for n in range(200_000)], concurrency=1
    )
    JobPool.objects.filter(name="default").update(pause_reason=PRINTABLE_EVIL * 50_000)
    return runs


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def within_budget(client: Client, url: str) -> bytes:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, url
    assert len(response.content) < PAGE_BUDGET, (url, len(response.content))
    assert len(queries) <= QUERY_BUDGET, (url, len(queries))
    assert b"<script>alert" not in response.content, url
    return bytes(response.content)


def test_every_admin_page_stays_within_budget(
    hostile: JobRun, forged: list[JobRun], admin_client: Client
) -> None:
    run = f"/admin/django_jobs/jobrun/{hostile.pk}"
    worker = Worker.objects.get(pid=1)
    step = JobStep.objects.filter(run=hostile).order_by("seq").first()
    assert step is not None
    pages = [
        "/admin/django_jobs/jobrun/",
        "/admin/django_jobs/jobrun/?status__exact=failed",
        "/admin/django_jobs/jobrun/?pool=default",
        f"/admin/django_jobs/jobrun/?parent={hostile.pk}",
        "/admin/django_jobs/jobrun/?q=tag%3Ax",
        f"{run}/change/",
        f"{run}/change/?steps=200",
        "/admin/django_jobs/jobrun/pools/",
        "/admin/django_jobs/worker/",
        f"/admin/django_jobs/worker/{worker.pk}/change/",
        "/admin/django_jobs/jobschedule/",
        f"/admin/django_jobs/worker/{Worker.objects.get(pid=2).pk}/change/",
        *(f"/admin/django_jobs/jobrun/{r.pk}/change/" for r in forged),
        f"/admin/django_jobs/jobrun/{forged[0].pk}/cancel/",
        f"{run}/retry/",
    ]
    for url in pages:
        within_budget(admin_client, url)
    # The downloads are the whole values, as compact JSON files: not pages.
    forged_run = f"/admin/django_jobs/jobrun/{forged[0].pk}"
    for url in (
        f"{run}/payload/input/",
        f"{run}/payload/error/",
        f"{run}/steps/{step.pk}/error/",
        f"{forged_run}/payload/input/",
        f"{forged_run}/payload/error/",
    ):
        response = admin_client.get(url)
        assert response.status_code == 200
        assert response["Content-Disposition"].startswith("attachment;")
        assert len(response.content) < 2_000_000


# Crafted requests (issue 32 §4): each is answered 4xx, whatever the rows hold.
CRAFTED = [
    "/admin/django_jobs/jobrun/?tenant=%00",
    "/admin/django_jobs/jobrun/?pool=%00",
    "/admin/django_jobs/jobrun/?job_type=%00",
    "/admin/django_jobs/jobrun/?status=%00",
    "/admin/django_jobs/jobrun/?status__exact=%00",
    "/admin/django_jobs/jobrun/?q=%00",
    "/admin/django_jobs/jobrun/?created_at__gte=%00",
    "/admin/django_jobs/jobrun/?created_at__lt=2026-13-45",
    "/admin/django_jobs/jobrun/?parent=x",
    "/admin/django_jobs/worker/?status=%00",
    "/admin/django_jobs/jobrun/%00/retry/",
    "/admin/django_jobs/jobrun/1/payload/input%00/",
    "/admin/django_jobs/jobrun/%00/payload/input/",
    "/admin/django_jobs/jobschedule/?q=%00",
    "/admin/django_jobs/jobschedule/%00/change/",
    "/admin/django_jobs/jobschedule/%00/delete/",
    "/admin/django_jobs/jobschedule/%00/history/",
    "/admin/django_jobs/jobschedule/%00/input/",
]
# Django's answer to an object page whose id names no object: back to the
# admin's index, saying so.
MISSING = ["/admin/django_jobs/jobrun/1%00/change/", "/admin/django_jobs/worker/%00/change/"]


def test_every_crafted_request_answers_4xx(
    hostile: JobRun, forged: list[JobRun], admin_client: Client
) -> None:
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(
        Permission.objects.filter(
            codename__in=["view_jobrun", "view_worker", "retry_jobrun", "view_jobschedule"]
        )
    )
    for user in (admin_client, Client(raise_request_exception=False)):
        if user is not admin_client:
            user.force_login(viewer)
        user.raise_request_exception = False
        for url in CRAFTED:
            response = user.get(url)
            assert 400 <= response.status_code < 500, (url, response.status_code)
        for url in MISSING:
            response = user.get(url)
            assert (response.status_code, response["Location"]) == (302, "/admin/"), url
        # Select all, then Retry, with ids that are not ids: nothing is retried.
        for selected in (["x"], [str(forged[2].pk), "\0"], ["1.5"]):
            for extra in ({}, {"select_across": "1"}, {"confirm": "yes"}):
                data = {"action": "retry_runs", "_selected_action": selected, "index": "0"}
                response = user.post("/admin/django_jobs/jobrun/", {**data, **extra})
                assert response.status_code == 400, (selected, extra, response.status_code)
    assert JobRun.objects.get(pk=forged[2].pk).status == Status.CANCELED


def test_every_command_stays_within_budget(
    hostile: JobRun, forged: list[JobRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt  # what stops --watch

    monkeypatch.setattr("time.sleep", interrupt)
    commands = [
        ["jobstatus"],
        ["jobstatus", "--json"],
        ["jobstatus", "--watch", "1"],
        ["jobstatus", "--watch", "1", "--json"],
        ["jobpool", "list"],
    ]
    for command in commands:
        out, err = io.StringIO(), io.StringIO()
        with CaptureQueriesContext(connection) as queries:
            call_command(*command, stdout=out, stderr=err)
        text = out.getvalue() + err.getvalue()
        assert len(text.encode()) < PAGE_BUDGET, command
        assert len(queries) <= QUERY_BUDGET, command
        assert not CONTROL.search(text), (command, text)
        if command[-1] != "list":
            assert f"#{forged[0].pk} " in text or f'"run_id": {forged[0].pk},' in text


def test_the_metrics_scrape_stays_within_budget(hostile: JobRun, forged: list[JobRun]) -> None:
    from django_jobs.metrics import metrics_view

    with CaptureQueriesContext(connection) as queries:
        response = metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    assert b"django_jobs_queue_up 1.0" in response.content
    assert len(response.content) < PAGE_BUDGET
    assert len(queries) <= QUERY_BUDGET
