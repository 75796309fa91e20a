"""Edge cases of the admin, batched completion and NOTIFY found in review."""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Permission, User
from django.db import DatabaseError, connection, connections
from django.test import Client
from django.urls import reverse

from django_jobs import claims, start
from django_jobs.batching import Completer
from django_jobs.execution import Outcome, execute
from django_jobs.models import JobRun, Status
from django_jobs.notify import raw_connection_params
from tests.factories import JobRunFactory, WorkerFactory
from tests.helpers import wait_until

CHANGELIST = reverse("admin:django_jobs_jobrun_changelist")


def operator() -> Client:
    user = User.objects.create_user("review-op", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_jobrun", "retry_jobrun"])
    )
    client = Client()
    client.force_login(user)
    return client


def confirmation_form(html: str) -> dict[str, Any]:
    """The fields the confirmation page's form posts back, as a browser would send them."""
    form = html[html.index('<form method="post">') :]
    form = form[: form.index("</form>")]
    data: dict[str, Any] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        if name == "csrfmiddlewaretoken":
            continue
        data.setdefault(name, []).append(value)
    return data


# --- admin --------------------------------------------------------------------------


@pytest.mark.django_db
def test_confirming_a_bulk_action_on_more_than_100_selected_runs_applies_to_all() -> None:
    # "Show all" lists up to list_max_show_all (200) runs on one page; the operator
    # ticks them all (no select_across needed, they are all on the page).
    runs = JobRunFactory.create_batch(150, status=Status.FAILED)
    client = operator()
    data = {"action": "retry_runs", "_selected_action": [r.pk for r in runs], "index": 0}
    confirm = client.post(CHANGELIST + "?all=", data)
    assert b"are you sure" in confirm.content
    assert b"Retry 150 runs" in confirm.content
    client.post(CHANGELIST + "?all=", confirmation_form(confirm.content.decode()))
    assert JobRun.objects.filter(status=Status.PENDING).count() == 150


@pytest.mark.django_db
def test_confirming_select_all_across_pages_applies_to_the_whole_filtered_set() -> None:
    runs = JobRunFactory.create_batch(120, status=Status.FAILED)
    JobRunFactory(status=Status.CANCELED)  # filtered out: must stay canceled
    client = operator()
    url = CHANGELIST + "?status__exact=failed"
    # The page shows 50; the operator ticks them, then "Select all 120" (select_across=1).
    data = {
        "action": "retry_runs",
        "_selected_action": [r.pk for r in runs[-50:]],
        "select_across": "1",
        "index": 0,
    }
    confirm = client.post(url, data)
    assert b"Retry 120 runs" in confirm.content
    done = client.post(url, confirmation_form(confirm.content.decode()), follow=True)
    assert JobRun.objects.filter(status=Status.PENDING).count() == 120, [
        str(m) for m in done.context["messages"]
    ]
    assert JobRun.objects.filter(status=Status.CANCELED).count() == 1


@pytest.mark.django_db
def test_the_run_page_of_a_run_with_more_than_50_children_renders() -> None:
    # children_links calls format_html() without arguments for the "more" line:
    # deprecated in Django 5.x (an error under -W error), a TypeError in Django 6.
    parent = JobRunFactory()
    JobRunFactory.create_batch(51, parent=parent, root=parent)
    client = operator()
    client.raise_request_exception = False
    url = reverse("admin:django_jobs_jobrun_change", args=[parent.pk])
    assert client.get(url).status_code == 200


@pytest.mark.django_db
def test_searching_a_unicode_digit_does_not_crash_the_changelist() -> None:
    JobRunFactory()
    client = operator()
    client.raise_request_exception = False
    # "²".isdigit() is True but int("²") raises ValueError.
    assert client.get(CHANGELIST, {"q": "²"}).status_code == 200


# --- batched completion -------------------------------------------------------------


def _claim(job_type: str = "tests.noop") -> claims.Claim:
    start(job_type)
    (claim,) = claims.claim_batch(WorkerFactory().pk, None, 1)
    return claim


class SameBatch:
    """Make every completion started inside the block land in one Completer batch.

    A first completion is held on a row lock taken by another connection, so the
    Completer's write blocks; the completions that gather meanwhile are written
    together once the lock is released.
    """

    def __init__(self, completer: Completer) -> None:
        self.completer = completer
        self.blocker = _claim()
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> SameBatch:
        self.lock = psycopg.connect(**raw_connection_params())
        self.lock.execute(
            "SELECT 1 FROM django_jobs_jobrun WHERE id = %s FOR UPDATE", [self.blocker.run_id]
        )
        try:
            self.spawn(self.completer.complete, self.blocker, None)
            wait_until(self._writer_blocked, timeout=10)
        except BaseException:
            self.lock.close()
            raise
        return self

    def _writer_blocked(self) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' "
                "AND query LIKE '%%UPDATE \"django_jobs_jobrun\" AS run%%'"
            )
            return bool(cursor.fetchone()[0])

    def spawn(self, fn: Any, *args: Any) -> None:
        def target() -> None:
            try:
                fn(*args)
            finally:
                connections.close_all()

        thread = threading.Thread(target=target)
        thread.start()
        self.threads.append(thread)

    def __exit__(self, *exc: Any) -> None:
        expected = len(self.threads) - 1
        try:
            wait_until(lambda: len(self.completer._items) == expected, timeout=10)
        finally:
            self.lock.rollback()
            self.lock.close()
        for thread in self.threads:
            thread.join(20)


@pytest.mark.django_db(transaction=True)
def test_one_unstorable_output_does_not_fail_the_other_runs_of_its_batch() -> None:
    innocent = _claim("tests.noop")
    poisoned = _claim("tests.noop")
    completer = Completer()
    outcomes: dict[int, Any] = {}

    def poison(claim: claims.Claim) -> None:
        # A value jsonb refuses (a lone surrogate); whatever slips past normalize()
        # must cost only its own run.
        try:
            outcomes[claim.run_id] = completer.complete(claim, "\ud800")
        except DatabaseError as exc:
            outcomes[claim.run_id] = exc

    try:
        with SameBatch(completer) as batch:
            batch.spawn(
                lambda c: outcomes.__setitem__(c.run_id, execute(c, complete=completer.complete)),
                innocent,
            )
            batch.spawn(poison, poisoned)
    finally:
        completer.close()
    assert isinstance(outcomes[poisoned.run_id], DatabaseError)
    # The innocent run returned None; it must not pay for its neighbour's output.
    innocent_run = JobRun.objects.get(pk=innocent.run_id)
    assert (innocent_run.status, innocent_run.error) == (Status.COMPLETED, None)
    assert outcomes[innocent.run_id] == Outcome.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_a_stale_lease_in_a_batch_gets_false_even_when_the_new_lease_of_that_run_wins() -> None:
    # A run fenced off while its handler still runs can be claimed again by the same
    # worker (worker.py keys in-flight runs by context for this reason); both
    # handlers may then finish in one batch.
    stale = _claim()
    JobRun.objects.filter(pk=stale.run_id).update(status=Status.PENDING, lease_token=None)
    (fresh,) = claims.claim_batch(WorkerFactory().pk, None, 1)
    assert fresh.run_id == stale.run_id
    assert fresh.lease_token != stale.lease_token
    completer = Completer()
    results: dict[uuid.UUID, bool] = {}
    try:
        with SameBatch(completer) as batch:
            for claim in (stale, fresh):
                batch.spawn(
                    lambda c: results.__setitem__(
                        c.lease_token, completer.complete(c, {"token": str(c.lease_token)})
                    ),
                    claim,
                )
    finally:
        completer.close()
    assert JobRun.objects.get(pk=fresh.run_id).output == {"token": str(fresh.lease_token)}
    assert results[fresh.lease_token] is True
    assert results[stale.lease_token] is False  # its write was fenced off


def test_the_admin_reads_runs_and_workers_from_the_jobs_database(settings: Any) -> None:
    from django.contrib import admin
    from django.test import RequestFactory

    from django_jobs.models import Worker

    # DATABASE names the alias holding the job tables; workers, api and the pools
    # page use it, so the changelist, run pages and workers pages must too.
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASE": "sqlite"}
    request = RequestFactory().get("/")
    for model in (JobRun, Worker):
        assert admin.site._registry[model].get_queryset(request).db == "sqlite", model
