"""``ctx.set_progress``: fenced writes, throttling, validation, and where progress is shown."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_jobs import context, handling, retry
from django_jobs.attempt import Attempt
from django_jobs.context import JobContext, LeaseLost
from django_jobs.models import JobRun, Status
from django_jobs.storage.claiming import Claim
from django_jobs.testing import drain
from tests.factories import RunningJobRunFactory

pytestmark = pytest.mark.django_db


def held(run: JobRun) -> JobContext:
    row = {
        "id": run.pk,
        "job_type": run.job_type,
        "pool": run.pool,
        "priority": run.priority,
        "input": run.input,
        "attempts": run.attempts,
        "max_attempts": run.max_attempts,
        "tenant_id": None,
        "parent_id": None,
        "root_id": None,
        "created_at": run.created_at,
        "run_at": run.run_at,
        "concurrency_key": None,
        "cancel_requested_at": None,
        "trace_context": None,
    }
    assert run.lease_token is not None
    return JobContext(Attempt.of(Claim.from_row(row, run.lease_token)))


def stored(run: JobRun) -> Any:
    return JobRun.objects.values_list("progress", flat=True).get(pk=run.pk)


def test_a_handler_reports_progress_and_it_stays_after_completion() -> None:
    from django_jobs import start

    run = start("tests.progress", {"items": 4})
    assert drain() == 1
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert run.progress is not None
    assert (run.progress["done"], run.progress["total"]) == (4, 4)
    assert run.progress["message"] == "all done"
    assert run.progress["at"]


def test_writes_are_throttled_except_first_message_change_and_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = RunningJobRunFactory()
    ctx = held(run)
    ctx.set_progress(1, 10)
    assert stored(run)["done"] == 1
    ctx.set_progress(2, 10)  # within the interval: held back
    assert stored(run)["done"] == 1
    ctx.set_progress(3, 10, message="halfway")  # a new message is written at once
    assert (stored(run)["done"], stored(run)["message"]) == (3, "halfway")
    ctx.set_progress(10, 10, message="halfway")  # the end is written at once
    assert stored(run)["done"] == 10
    monkeypatch.setattr(context, "PROGRESS_INTERVAL", 0.0)
    ctx.set_progress(11, message="halfway")
    assert (stored(run)["done"], stored(run)["total"]) == (11, None)


def test_a_held_back_value_is_written_after_the_next_step() -> None:
    run = RunningJobRunFactory()
    ctx = held(run)
    ctx.set_progress(1, 10)
    ctx.set_progress(2, 10)
    assert stored(run)["done"] == 1
    ctx.step("fetch", lambda: "fetched")
    assert stored(run)["done"] == 2


def test_a_held_back_value_is_written_when_the_handler_returns() -> None:
    from django_jobs import start

    run = start("tests.progress_held", {})
    assert drain() == 1
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert (run.progress["done"], run.progress["total"]) == (2, 10)


def test_a_run_that_failed_for_good_keeps_its_last_progress() -> None:
    from django_jobs import start

    run = start("tests.progress_held", {"fail": True})
    JobRun.objects.filter(pk=run.pk).update(max_attempts=1)
    assert drain() == 1
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.progress["done"] == 2


def test_an_automatic_retry_clears_the_attempts_progress() -> None:
    from django_jobs import start

    run = start("tests.progress_held", {"fail": True})
    assert drain() == 1
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.PENDING, 1)
    assert run.progress is None


def test_rescue_and_release_clear_the_progress() -> None:
    from django_jobs import transitions
    from django_jobs.storage import leases

    rescued = RunningJobRunFactory(claimed_by=None, max_attempts=3)
    held(rescued).set_progress(1, 10)
    assert transitions.rescue_stale(None, stale_after=30) == (1, 0)
    assert stored(rescued) is None

    released = RunningJobRunFactory()
    ctx = held(released)
    ctx.set_progress(1, 10)
    assert released.claimed_by_id is not None
    assert released.lease_token is not None
    claim = Claim(run_id=released.pk, attempt=released.attempts, lease_token=released.lease_token)
    assert leases.release(released.claimed_by_id, [claim]) == 1
    assert stored(released) is None


def test_a_worker_that_lost_the_run_writes_no_progress() -> None:
    run = RunningJobRunFactory()
    ctx = held(run)
    JobRun.objects.filter(pk=run.pk).update(lease_token=uuid.uuid4())
    with pytest.raises(LeaseLost):
        ctx.set_progress(1, 2)
    assert stored(run) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 10), "done must be a number >= 0"),
        (("1", 10), "done must be a number >= 0"),
        ((True, 10), "done must be a number >= 0"),
        ((1, -2), "total must be a number >= 0"),
        ((1, float("inf")), "total must be finite"),
        ((float("nan"), 2), "done must be a number >= 0"),
    ],
)
def test_bad_values_are_refused_with_a_clear_error(args: tuple[Any, Any], message: str) -> None:
    run = RunningJobRunFactory()
    with pytest.raises(ValueError, match=message):
        held(run).set_progress(*args)
    assert stored(run) is None


def test_bad_message_is_refused_and_a_long_one_is_cut() -> None:
    run = RunningJobRunFactory()
    ctx = held(run)
    with pytest.raises(ValueError, match="message must be a string"):
        ctx.set_progress(1, 2, message=3)  # type: ignore[arg-type]
    ctx.set_progress(1, 2, message="x" * 5000)
    assert len(stored(run)["message"]) == handling.MAX_PROGRESS_MESSAGE


def test_manual_retry_clears_the_old_progress() -> None:
    run = RunningJobRunFactory()
    held(run).set_progress(5, 10)
    JobRun.objects.filter(pk=run.pk).update(status=Status.FAILED, lease_token=None)
    assert retry(run.pk).progress is None


def test_admin_shows_progress_on_the_run_page(admin_client: Client) -> None:
    run = RunningJobRunFactory()
    held(run).set_progress(3, 12, message="copying <rows>")
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "3 / 12 (25%)" in text
    assert "copying &lt;rows&gt;" in text
    listing = admin_client.get(reverse("admin:django_jobs_jobrun_changelist"))
    assert "3 / 12 (25%)" in listing.content.decode()
