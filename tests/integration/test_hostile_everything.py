"""Every field a caller or a handler can fill, filled with the worst at once (issue 16).

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
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
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


def test_every_admin_page_stays_within_budget(hostile: JobRun, admin_client: Client) -> None:
    run = f"/admin/django_jobs/jobrun/{hostile.pk}"
    worker = Worker.objects.get()
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
    ]
    for url in pages:
        within_budget(admin_client, url)
    # The downloads are the whole values, as compact JSON files: not pages.
    for url in (f"{run}/payload/input/", f"{run}/payload/error/", f"{run}/steps/{step.pk}/error/"):
        response = admin_client.get(url)
        assert response.status_code == 200
        assert response["Content-Disposition"].startswith("attachment;")
        assert len(response.content) < 2_000_000


def test_every_command_stays_within_budget(hostile: JobRun) -> None:
    for command in (["jobstatus"], ["jobstatus", "--json"], ["jobpool", "list"]):
        out, err = io.StringIO(), io.StringIO()
        with CaptureQueriesContext(connection) as queries:
            call_command(*command, stdout=out, stderr=err)
        text = out.getvalue() + err.getvalue()
        assert len(text.encode()) < PAGE_BUDGET, command
        assert len(queries) <= QUERY_BUDGET, command
        assert not CONTROL.search(text), (command, text)
