"""Hostile rows on the admin, ``jobstatus``, ``jobpool list`` and the metrics (issue 32 §5).

The database is trusted, but one bad row must not stop the others: a run whose
JSON Python cannot read back (a number of 5,001 digits, 10,000 levels of
nesting, text that is not JSON where a CHECK constraint was turned off), a
progress of the wrong shape or with a date that is not one, 200,000 tags or
worker ids, a reason of megabytes. Each page and command shows that row cut or
marked, with one log line, and the other rows as always.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from django_jobs.models import JobPool, JobRun, Status, Worker
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

HUGE_NUMBER = "1" + "0" * 5_000
BAD_JSON = {
    "huge number": f'{{"done": {HUGE_NUMBER}, "total": 10, "message": "m"}}',
    "deep": "[" * 10_000 + "]" * 10_000,
    "not json": '{"done": ',
}
JSON_COLUMNS = [
    "progress",
    "tags",
    "worker_ids",
    "awaiting",
    "trace_context",
    "input",
    "output",
    "error",
]
# The columns the run page shows: an unreadable one is marked there.
SHOWN = {"progress", "tags", "worker_ids", "input", "output", "error"}
CHANGELIST = reverse("admin:django_jobs_jobrun_changelist")
# What one page or command may weigh here, whatever a row holds.
BUDGET = 200_000


@contextmanager
def checks_off() -> Iterator[None]:
    """Let this connection store what the JSON columns' CHECK constraints refuse."""
    setting = {"mysql": "SET SESSION check_constraint_checks = {}"}.get(connection.vendor)
    if setting is None:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute(setting.format(0))
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(setting.format(1))


def store(model: Any, pk: Any, column: str, text: str) -> None:
    """Write ``text`` into a JSON column as it is, past what the ORM would check."""
    if connection.vendor == "postgresql" and text == BAD_JSON["not json"]:
        pytest.skip("jsonb stores JSON only")
    table = connection.ops.quote_name(model._meta.db_table)
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with checks_off(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name(column)} = %s{cast} WHERE id = %s",
            [text, pk],
        )
        assert cursor.rowcount == 1


@pytest.fixture
def client() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    assert len(response.content) < BUDGET, (url, len(response.content))
    return response.content.decode()


def command(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    assert len(text) < BUDGET, (args, len(text))
    return text


def scrape() -> str:
    from django_jobs.metrics import metrics_view

    response = metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    text = response.content.decode()
    assert "django_jobs_queue_up 1.0" in text
    return text


def run_url(run: JobRun, name: str = "change") -> str:
    return reverse(f"admin:django_jobs_jobrun_{name}", args=[run.pk])


@pytest.fixture
def good() -> JobRun:
    """The run beside the bad one, which every page and command must still show."""
    return RunningJobRunFactory(
        progress={"done": 1, "total": 4, "message": "good-progress"}, tags=["good-tag"]
    )


@pytest.mark.parametrize("value", list(BAD_JSON))
@pytest.mark.parametrize("column", JSON_COLUMNS)
def test_a_run_whose_json_cannot_be_read_is_marked_and_the_others_shown(
    client: Client, good: JobRun, column: str, value: str
) -> None:
    bad = RunningJobRunFactory()
    store(JobRun, bad.pk, column, BAD_JSON[value])

    listing = page(client, CHANGELIST)
    assert run_url(bad) in listing
    assert "good-progress" in listing
    if column == "progress":
        assert "unreadable" in listing
    bad_page = page(client, run_url(bad))
    if column in SHOWN:
        assert "unreadable" in bad_page
    good_page = page(client, run_url(good))
    assert "good-progress" in good_page
    assert "good-tag" in good_page
    page(client, run_url(bad, "cancel"))  # the confirmation
    page(client, reverse("admin:django_jobs_jobrun_pools"))
    page(client, reverse("admin:django_jobs_worker_changelist"))
    page(client, reverse("admin:django_jobs_worker_change", args=[bad.claimed_by_id]))
    if column in ("input", "output", "error"):
        download = client.get(f"{CHANGELIST}{bad.pk}/payload/{column}/")
        assert download.status_code == 200
        assert download["Content-Disposition"].startswith("attachment;")
        # The text the database holds, as it holds it: nothing to decode.
        assert download.content.decode().replace(" ", "") == BAD_JSON[value].replace(" ", "")

    for args in (["jobstatus"], ["jobstatus", "--json"]):
        text = command(*args)
        assert "good-progress" in text
        if column == "progress":
            assert f"#{bad.pk} " in text or f'"run_id": {bad.pk},' in text
            assert "unreadable" in text
    command("jobpool", "list")
    scrape()


@pytest.mark.parametrize(
    "progress",
    [
        {"done": 1, "total": 2, "message": "m", "at": "2026-13-45T99:99:99"},
        {"done": 1, "total": 2, "message": "m", "at": "2026-02-30T10:00:00+00:00"},
        {"done": 1, "total": 2, "message": "m", "at": ["2026-01-01"]},
        {"done": "x", "total": [1], "message": {"a": 1}, "at": 5},
        {"done": 10**300, "total": -4, "message": "m" * 5_000},
        {"done": -3, "total": 0},
        [1, 2, 3],
        "half done",
        17,
    ],
)
def test_a_progress_of_the_wrong_shape_is_shown_and_the_others_too(
    client: Client, good: JobRun, progress: Any
) -> None:
    bad = RunningJobRunFactory()
    JobRun.objects.filter(pk=bad.pk).update(progress=progress)
    assert "good-progress" in page(client, CHANGELIST)
    page(client, run_url(bad))
    page(client, reverse("admin:django_jobs_jobrun_pools"))
    for args in (["jobstatus"], ["jobstatus", "--json"]):
        text = command(*args)
        assert "good-progress" in text
        assert "m" * 1_001 not in text
    scrape()


def test_jobstatus_watch_shows_a_hostile_progress(
    good: JobRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = RunningJobRunFactory()
    store(JobRun, bad.pk, "progress", BAD_JSON["huge number"])
    JobRun.objects.filter(pk=good.pk).update(
        progress={"done": 1, "total": 2, "message": "good-progress", "at": "2026-13-45"}
    )

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", interrupt)
    for args in (["--watch", "1"], ["--watch", "1", "--json"]):
        text = command("jobstatus", *args)
        assert "good-progress" in text
        assert "unreadable" in text


def test_200_000_tags_and_worker_ids_are_shown_cut(client: Client, good: JobRun) -> None:
    run = JobRunFactory(status=Status.FAILED, attempts=3)
    JobRun.objects.filter(pk=run.pk).update(
        tags=[f"tag-{n}" for n in range(200_000)],
        worker_ids=[f"{n:08d}-0000-0000-0000-000000000000" for n in range(200_000)],
    )
    html = page(client, run_url(run))
    assert "tag-0" in html
    assert "tag-199999" not in html
    assert "00000000-0000-0000-0000-000000000000" in html
    assert html.count("and 199,950 more") == 2
    assert "good-tag" in page(client, run_url(good))


def test_tags_and_worker_ids_of_other_types_are_shown(client: Client) -> None:
    run = JobRunFactory(status=Status.FAILED, attempts=1)
    for tags, worker_ids in (
        ({"a": 1}, "w"),
        ([["nested"], 3, None, "x" * 5_000], [{"id": 1}, 7]),
        ("one", {"w": "x" * 5_000}),
    ):
        JobRun.objects.filter(pk=run.pk).update(tags=tags, worker_ids=worker_ids)
        html = page(client, run_url(run))
        assert "x" * 1_001 not in html


def test_a_huge_cancel_reason_and_pause_reason_are_shown_cut(client: Client) -> None:
    run = JobRunFactory(status=Status.CANCELED, cancel_reason="r" * 5_000_000)
    JobPool.objects.create(name="default", paused_at=timezone.now(), pause_reason="p" * 5_000_000)
    assert "r" * 1_000 + "…" in page(client, run_url(run))
    assert "p" * 1_000 + "…" in page(client, reverse("admin:django_jobs_jobrun_pools"))
    for args in (["jobstatus"], ["jobpool", "list"]):
        assert "p" * 1_000 + "…" in command(*args)
    status = json.loads(command("jobstatus", "--json"))
    assert status["pools"][0]["pause_reason"] == "p" * 1_000 + "…"


@pytest.mark.parametrize("pools", ["huge number", "200,000 pools", "not a list"])
def test_a_worker_whose_pools_cannot_be_read_or_are_too_many(
    client: Client, good: JobRun, pools: str
) -> None:
    worker = WorkerFactory(hostname="hostile-host")
    if pools == "huge number":
        store(Worker, worker.pk, "pools", f"[{HUGE_NUMBER}]")
    elif pools == "200,000 pools":
        Worker.objects.filter(pk=worker.pk).update(pools=[f"p{n}" for n in range(200_000)])
    else:
        Worker.objects.filter(pk=worker.pk).update(pools={"a": [1]})
    page(client, CHANGELIST)
    assert "hostile-host" in page(client, reverse("admin:django_jobs_worker_changelist"))
    page(client, reverse("admin:django_jobs_worker_change", args=[worker.pk]))
    page(client, reverse("admin:django_jobs_jobrun_pools"))
    for args in (["jobstatus"], ["jobstatus", "--json"]):
        text = command(*args)
        assert "hostile-host" in text
        assert "good-progress" in text
    scrape()

    from django_jobs.health import newest_beat

    newest_beat("hostile-host")  # the probe of that host reads its row without failing


def test_one_log_line_per_bad_value(
    client: Client, good: JobRun, caplog: pytest.LogCaptureFixture
) -> None:
    bad = RunningJobRunFactory()
    store(JobRun, bad.pk, "progress", BAD_JSON["huge number"])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            page(client, CHANGELIST)
            page(client, run_url(bad))
            command("jobstatus")
    said = [r for r in caplog.records if f"run={bad.pk} " in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "progress" in said[0].getMessage()
    assert said[0].levelno == logging.WARNING


@pytest.mark.parametrize(
    "error",
    [
        [1, 2],
        "boom",
        {"type": 5, "message": ["m"], "traceback": {"t": 1}, "attempt": "x" * 5_000},
        {"type": "t" * 5_000, "message": "m", "retryable": [False]},
    ],
)
def test_an_error_of_the_wrong_shape_is_shown(client: Client, error: Any) -> None:
    run = JobRunFactory(status=Status.FAILED, attempts=1, error=error)
    waiting = JobRunFactory(status=Status.WAITING, awaiting="not a list", trace_context=[1])
    html = page(client, run_url(run))
    assert "x" * 21 not in html  # an attempt number is shown cut
    assert "t" * 1_001 not in html
    page(client, run_url(waiting))
    page(client, CHANGELIST)
