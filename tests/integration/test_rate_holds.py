"""Runs held while their rate limit's window is full (``storage.rateholds``): out of
the claim's way, released as the window opens, never started beyond the limit."""

from __future__ import annotations

import html
import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_jobs import cancel, start, start_many
from django_jobs.models import Hold, JobRateLimit, JobRun, Status
from django_jobs.ratelimits import Limits, Rate
from django_jobs.storage import claiming, rateholds, upkeep
from django_jobs.storage import ratelimits as limited
from django_jobs.testing import drain
from tests.factories import WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)

HOURLY = Limits({"tests.limited": Rate(2, 3600.0)})
KEYED = Limits({"tests.limited_per_key": Rate(1, 3600.0)}, frozenset({"tests.limited_per_key"}))


def claim(limits: Limits, n: int = 10, pools: list[str] | None = None) -> list[int]:
    taken = claiming.claim_batch(WorkerFactory().pk, pools, n, limits=limits)
    return [c.run_id for c in taken]


def held(hold: str = Hold.RATE) -> set[int]:
    return set(JobRun.objects.filter(status=Status.PENDING, hold=hold).values_list("pk", flat=True))


def open_window(scope: str, name: str) -> None:
    """As time would: the window's reopen time has come and gone, its starts too."""
    JobRateLimit.objects.filter(scope=scope, name=name).update(
        starts=[], open_at=timezone.now() - timedelta(seconds=1)
    )


def test_runs_refused_for_a_full_window_are_held_and_the_rest_claimed(claim_forms: str) -> None:
    limited_runs = start_many("tests.limited", [{}] * 5, pool="default")
    plain = start_many("tests.noop", [{}] * 3)
    taken = claim(HOURLY, pools=["default"])
    assert set(taken) == {*[r.pk for r in limited_runs[:2]], *[r.pk for r in plain]}
    # The three the claim refused wait out of the claim's index.
    assert held() == {r.pk for r in limited_runs[2:]}
    more = start_many("tests.noop", [{}] * 2)
    assert set(claim(HOURLY, pools=["default"])) == {r.pk for r in more}
    assert limited.waiting(HOURLY) == {"default": 3}


def test_a_backlog_started_while_the_window_is_full_is_held_by_the_pass() -> None:
    start_many("tests.limited", [{}] * 2, pool="default")
    assert len(claim(HOURLY, pools=["default"])) == 2
    backlog = start_many("tests.limited", [{}] * 50, pool="default")
    assert held() == set()
    assert rateholds.hold_full(HOURLY, ["default"]) == 50
    assert held() == {r.pk for r in backlog}
    # Nothing of a full window left to hold; no window full, nothing read.
    assert rateholds.hold_full(HOURLY, ["default"]) == 0
    JobRateLimit.objects.update(open_at=None)
    assert rateholds.hold_full(HOURLY, ["default"]) == 0


def test_an_opened_window_releases_as_many_as_it_allows_in_claim_order() -> None:
    runs = [start("tests.limited", pool="default", priority=p) for p in (0, 0, 0, 0, 5, 0)]
    assert len(claim(HOURLY, pools=["default"])) == 2  # the priority 5 run and the first
    assert len(held()) == 4
    assert rateholds.release_open(HOURLY, 0.5) == 0  # not open yet
    open_window("job", "tests.limited")
    assert rateholds.release_open(HOURLY, 0.5) == 2
    assert held() == {runs[3].pk, runs[5].pk}
    assert set(claim(HOURLY, pools=["default"])) == {runs[1].pk, runs[2].pk}
    # Full again: its runs stay held until it opens again.
    assert held() == {runs[3].pk, runs[5].pk}
    open_window("job", "tests.limited")
    assert rateholds.release_open(HOURLY, 0.5) == 2
    assert set(claim(HOURLY, pools=["default"])) == {runs[3].pk, runs[5].pk}
    # A window opened with nothing held is noted, and not looked at again.
    open_window("job", "tests.limited")
    assert rateholds.release_open(HOURLY, 0.5) == 0
    assert list(rateholds._emptied.values()) == [JobRateLimit.objects.get().open_at]


def test_a_window_that_opens_often_releases_enough_for_a_tick() -> None:
    assert rateholds._per_tick(Rate(10, 0.1), 0.5) == 50
    assert rateholds._per_tick(Rate(2, 3600.0), 0.5) == 2
    assert rateholds._per_tick(Rate(100_000, 1.0), 0.5) == 1000


def test_keys_are_held_and_released_apart() -> None:
    one = start_many("tests.limited_per_key", [{"customer": 1}] * 3)
    two = start_many("tests.limited_per_key", [{"customer": 2}] * 3)
    free = start("tests.limited_per_key", {})
    assert set(claim(KEYED)) == {one[0].pk, two[0].pk, free.pk}
    assert held() == {r.pk for r in [*one[1:], *two[1:]]}
    open_window("key", "customer:2")
    assert rateholds.release_open(KEYED, 0.5) == 1
    assert held() == {r.pk for r in [*one[1:], two[2]]}
    assert claim(KEYED) == [two[1].pk]


def test_a_pool_whose_window_is_full_is_not_read_and_not_held() -> None:
    limits = Limits(pools={"p": Rate(2, 3600.0)})
    start_many("tests.noop", [{}] * 5, pool="p")
    assert len(claim(limits, pools=["p"])) == 2
    assert claim(limits, pools=["p"]) == []
    assert held() == set()
    pick = claiming.candidates(["p"], locked=False, limits=limits)
    assert not pick.exists()
    if connection.vendor == "postgresql":
        # A condition on no run, decided once: the scan of the pool's runs never runs.
        plan = pick.values("id")[:10].explain(analyze=True)
        assert "One-Time Filter" in plan
        assert "never executed" in plan


def test_held_runs_of_a_limit_since_removed_are_released_by_the_sweep() -> None:
    start_many("tests.limited", [{}] * 4, pool="default")
    claim(HOURLY, pools=["default"])
    assert len(held()) == 2
    # Still full under the rate in force: the sweep leaves them.
    assert upkeep.every_sweep(["default"], HOURLY, ["tests.limited"], 0.5) is False
    # The limit is gone from the code (or raised): released at once.
    assert rateholds.release_stranded(Limits(), ["tests.limited"], 0.5) == 2
    assert held() == set()


def test_a_held_run_is_canceled_and_retried_as_any_pending_run() -> None:
    start_many("tests.limited", [{}] * 3, pool="default")
    claim(HOURLY, pools=["default"])
    (run_id,) = held()
    assert cancel(run_id) == 1
    run = JobRun.objects.get(pk=run_id)
    assert (run.status, run.hold) == (Status.CANCELED, Hold.READY)
    from django_jobs import retry

    assert retry(run_id).hold == Hold.READY


def test_drain_enforces_no_limit_and_runs_the_held_runs() -> None:
    start_many("tests.limited", [{}] * 4, pool="default")
    claim(HOURLY, pools=["default"])
    assert len(held()) == 2
    assert drain("default") == 2
    assert held() == set()


def test_operators_see_when_a_held_runs_window_opens(admin_client: Any) -> None:
    from prometheus_client import CollectorRegistry

    from django_jobs import metrics

    runs = start_many("tests.limited", [{}] * 25, pool="ratelimited")
    # tests.limited is under 20/s: a window closed for the next five minutes.
    JobRateLimit.objects.create(
        scope="job",
        name="tests.limited",
        limit=20,
        period=1.0,
        open_at=timezone.now() + timedelta(minutes=5),
    )
    assert rateholds.hold_full(Limits({"tests.limited": Rate(20, 1.0)}), None) == 25
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[runs[0].pk]))
    content = html.unescape(page.content.decode())
    assert "its rate limit 20/s (Job type tests.limited), whose window opens at" in content
    out = StringIO()
    call_command("jobstatus", "--json", stdout=out)
    (pool,) = [p for p in json.loads(out.getvalue())["pools"] if p["pool"] == "ratelimited"]
    assert (pool["held_for_rate"], pool["rate_limited"]) == (25, 25)
    registry = CollectorRegistry()
    metrics.install(registry)
    labels = {"pool": "ratelimited", "reason": "rate"}
    assert registry.get_sample_value("django_jobs_queue_held_runs", labels) == 25
    # Open now, not yet released: the page says it is next.
    JobRateLimit.objects.update(open_at=timezone.now() - timedelta(seconds=1))
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[runs[0].pk]))
    assert "open now: it is released next" in html.unescape(page.content.decode())


def test_runs_started_while_their_window_is_full_start_held() -> None:
    JobRateLimit.objects.create(
        scope="job",
        name="tests.limited",
        limit=20,
        period=1.0,
        open_at=timezone.now() + timedelta(minutes=5),
    )
    one = start("tests.limited")
    many = start_many("tests.limited", [{}] * 3)
    later = start("tests.limited", delay=60)  # held, if still full, once due
    plain = start("tests.noop")
    assert {run.hold for run in [one, *many]} == {Hold.RATE}
    assert held() == {run.pk for run in [one, *many]}
    assert (later.hold, plain.hold) == (Hold.READY, Hold.READY)
    # A window closed under another rate than the job's is not full for it.
    JobRateLimit.objects.update(limit=5)
    assert start("tests.limited").hold == Hold.READY


def test_keyed_runs_start_held_for_their_own_key_only() -> None:
    JobRateLimit.objects.create(
        scope="key",
        name="customer:1",
        limit=2,
        period=3600.0,
        open_at=timezone.now() + timedelta(minutes=5),
    )
    runs = start_many("tests.limited_per_key", [{"customer": 1}, {"customer": 2}, {}])
    assert [run.hold for run in runs] == [Hold.RATE, Hold.READY, Hold.READY]


def test_a_claim_beside_a_held_backlog_reads_what_it_takes() -> None:
    """The runs held for a full window are in no claim's index: a claim under the
    limits reads the runs it takes, on every database (MySQL and MariaDB count
    the rows a session read; elsewhere the claim must at least take them)."""
    start_many("tests.limited", [{}] * 2, pool="default")
    claim(HOURLY, pools=["default"])
    start_many("tests.limited", [{}] * 5000, pool="default")
    rateholds.hold_full(HOURLY, ["default"])
    plain = start_many("tests.noop", [{}] * 3000)
    if connection.vendor != "mysql":
        assert set(claim(HOURLY, 16, pools=["default"])) <= {run.pk for run in plain}
        return
    with connection.cursor() as cursor:
        cursor.execute("FLUSH STATUS")
    assert len(claim(HOURLY, 16, pools=["default"])) == 16
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        read = sum(int(value) for _, value in cursor.fetchall())
    assert read < 1000
