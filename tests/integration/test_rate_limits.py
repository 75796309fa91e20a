"""Rate limits at claim: with real transactions, and claimers racing on real connections."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_jobs import start, start_many
from django_jobs.models import JobRateLimit, JobRun, Status
from django_jobs.ratelimits import Limits, Rate
from django_jobs.snapshot import snapshot
from django_jobs.storage import claiming, rateholds
from django_jobs.storage import ratelimits as limited
from tests.factories import JobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)

HOURLY = Rate(3, 3600.0)


def claim(limits: Limits, n: int = 10, pools: list[str] | None = None) -> list[int]:
    worker = WorkerFactory()
    return [c.run_id for c in claiming.claim_batch(worker.pk, pools, n, limits=limits)]


def test_a_job_limit_admits_its_count_in_a_window_and_then_nothing() -> None:
    runs = [JobRunFactory(job_type="tests.limited") for _ in range(5)]
    limits = Limits({"tests.limited": HOURLY})
    assert claim(limits) == [run.pk for run in runs[:3]]
    assert claim(limits) == []
    row = JobRateLimit.objects.get(scope="job", name="tests.limited")
    assert (row.limit, row.period) == (3, 3600.0)
    started = {r.started_at for r in JobRun.objects.filter(status=Status.RUNNING)}
    assert len(started) == 1  # one claim, one instant: its starts are stored as one entry
    (first,) = started
    assert row.open_at == first + timedelta(hours=1)
    assert row.starts == [[first.timestamp(), 3]]


def test_runs_of_a_full_window_are_not_even_candidates() -> None:
    """A spent limit hides its runs from the claim, so that no worker spins on them."""
    for _ in range(6):
        JobRunFactory(job_type="tests.limited")
    limits = Limits({"tests.limited": HOURLY})
    claim(limits)
    due = claiming.candidates(None, locked=False)
    assert limited.limited(due, limits).count() == 0
    assert limited.waiting(limits) == {"default": 3}
    assert limited.next_open() is not None


def test_the_window_slides_rather_than_resetting() -> None:
    for _ in range(8):
        JobRunFactory(job_type="tests.limited")
    limits = Limits({"tests.limited": HOURLY})
    assert len(claim(limits)) == 3
    now = timezone.now().timestamp()
    # Two of the starts were 59 minutes ago, one 61 minutes ago: one start is allowed.
    JobRateLimit.objects.filter(name="tests.limited").update(
        starts=[[now - 3660, 1], [now - 3540, 2]], open_at=timezone.now() - timedelta(seconds=1)
    )
    # The runs refused meanwhile wait held: the worker's pass releases them as the
    # window opens.
    assert rateholds.release_open(limits, 0.5) == 3
    assert len(claim(limits)) == 1
    assert claim(limits) == []


def test_unlimited_runs_of_the_pool_are_not_held_by_a_spent_limit() -> None:
    for _ in range(5):
        JobRunFactory(job_type="tests.limited", priority=5)
    plain = [JobRunFactory(job_type="tests.noop") for _ in range(3)]
    limits = Limits({"tests.limited": Rate(1, 3600.0)})
    first = claim(limits)
    assert len(first) == 4  # the plain runs, then one limited run
    assert {run.pk for run in plain} <= set(first)
    more = [JobRunFactory(job_type="tests.noop") for _ in range(2)]
    assert claim(limits) == [run.pk for run in more]


def test_a_keyed_limit_is_one_limit_per_key_and_a_run_without_a_key_is_free() -> None:
    a = [start("tests.limited_per_key", {"customer": 1}) for _ in range(3)]
    b = [start("tests.limited_per_key", {"customer": 2}) for _ in range(3)]
    free = start("tests.limited_per_key", {})
    assert a[0].rate_key == "customer:1"
    assert free.rate_key is None
    limits = Limits(
        {"tests.limited_per_key": Rate(2, 3600.0)}, frozenset({"tests.limited_per_key"})
    )
    assert set(claim(limits)) == {a[0].pk, a[1].pk, b[0].pk, b[1].pk, free.pk}
    assert claim(limits) == []
    assert limited.waiting(limits) == {"ratelimited": 2}


def test_start_many_writes_each_runs_key() -> None:
    runs = start_many("tests.limited_per_key", [{"customer": 1 + n % 2} for n in range(4)] + [{}])
    stored = dict(JobRun.objects.values_list("pk", "rate_key"))
    assert [stored[run.pk] for run in runs] == [
        "customer:1",
        "customer:2",
        "customer:1",
        "customer:2",
        None,
    ]
    assert [run.rate_key for run in runs] == [stored[run.pk] for run in runs]


def test_a_pool_limit_covers_every_run_of_the_pool_with_its_own_limits() -> None:
    for _ in range(3):
        JobRunFactory(job_type="tests.limited", pool="p")
    for _ in range(3):
        JobRunFactory(job_type="tests.noop", pool="p")
    other = JobRunFactory(job_type="tests.noop", pool="q")
    limits = Limits({"tests.limited": Rate(1, 3600.0)}, pools={"p": Rate(3, 3600.0)})
    claimed = claim(limits, pools=["p", "q"])
    assert len(claimed) == 4
    assert other.pk in claimed
    # In claim order: a limited run (its own limit is then spent), two of the others.
    kinds = JobRun.objects.filter(pk__in=claimed, pool="p").values_list("job_type", flat=True)
    assert sorted(kinds) == ["tests.limited", "tests.noop", "tests.noop"]
    assert claim(limits, pools=["p", "q"]) == []


def test_a_retried_attempt_is_a_start_of_its_own() -> None:
    JobRunFactory(job_type="tests.limited")
    limits = Limits({"tests.limited": Rate(1, 3600.0)})
    worker = WorkerFactory()
    (first,) = claiming.claim_batch(worker.pk, None, 1, limits=limits)
    # Its attempt failed and it is due again at once: the next attempt waits for the window.
    JobRun.objects.filter(pk=first.run_id).update(
        status=Status.PENDING, lease_token=None, claimed_by=None
    )
    assert claim(limits) == []
    assert limited.waiting(limits) == {"default": 1}


@pytest.mark.parametrize("round", range(4))
def test_racing_claimers_admit_no_more_than_the_limit_between_them(round: int) -> None:
    """Six claimers race from the limit's very first claim (no row yet: whoever
    makes it must hold it) to its last."""
    for _ in range(60):
        JobRunFactory(job_type="tests.limited")
    workers = [WorkerFactory() for _ in range(6)]
    limits = Limits({"tests.limited": Rate(10, 3600.0)})
    barrier = threading.Barrier(len(workers))

    def claim_all(worker_id: object) -> list[int]:
        claimed: list[int] = []
        try:
            barrier.wait(10)
            for _ in range(5):
                batch = claiming.claim_batch(worker_id, None, 3, limits=limits)  # type: ignore[arg-type]
                claimed += [c.run_id for c in batch]
            return claimed
        finally:
            connections.close_all()

    with ThreadPoolExecutor(len(workers)) as pool:
        results = list(pool.map(claim_all, [w.pk for w in workers]))
    claimed = [run_id for result in results for run_id in result]
    assert len(claimed) == len(set(claimed)) == 10
    assert JobRun.objects.filter(status=Status.RUNNING).count() == 10


def test_without_limits_the_claim_enforces_none() -> None:
    for _ in range(5):
        JobRunFactory(job_type="tests.limited")
    assert len(claim(Limits())) == 5


def test_jobstatus_and_the_pools_page_show_runs_waiting_for_their_window(
    settings: Any, admin_client: Client
) -> None:
    settings.DJANGO_JOBS = {"RATE_LIMITS": {"ratelimited": "100/m"}}
    for _ in range(3):
        JobRunFactory(job_type="tests.limited", pool="ratelimited")
    JobRunFactory(job_type="tests.noop", pool="ratelimited")
    JobRateLimit.objects.create(  # closed under tests.limited's rate, 20/s
        scope="job",
        name="tests.limited",
        limit=20,
        period=1.0,
        open_at=timezone.now() + timedelta(minutes=5),
    )
    shot = snapshot()
    (pool,) = shot.pools
    assert (pool.rate_limited, pool.rate_limit) == (3, "100/m")
    out = StringIO()
    call_command("jobstatus", stdout=out)
    assert "ratelimited rate-limited: 3 due runs wait for a window (pool limit 100/m)" in (
        out.getvalue()
    )
    page = admin_client.get(reverse("admin:django_jobs_jobrun_pools")).content.decode()
    assert "(3 rate-limited)" in page
    assert "limit 100/m" in page


def test_a_worker_enforces_a_jobs_limit_in_whatever_pool_its_runs_wait() -> None:
    from django_jobs.worker import JobWorker

    for _ in range(3):
        start("tests.limited", pool="elsewhere")
    worker = JobWorker(["elsewhere"])
    assert worker.limits.jobs["tests.limited"] == Rate(20, 1.0)
    limits = Limits({"tests.limited": Rate(2, 3600.0)})
    assert len(claim(limits, pools=["elsewhere"])) == 2


def limits_of_scope(scope: str, rate: Rate) -> Limits:
    if scope == "pool":
        return Limits(pools={"default": rate})
    if scope == "key":
        return Limits({"tests.limited_per_key": rate}, frozenset({"tests.limited_per_key"}))
    return Limits({"tests.limited": rate})


@pytest.mark.parametrize("scope", ["job", "key", "pool"])
@pytest.mark.parametrize(
    ("before", "after"), [(Rate(1, 60.0), Rate(10, 1.0)), (Rate(1, 86_400.0), Rate(1000, 86_400.0))]
)
def test_a_window_closed_under_one_rate_opens_under_another(
    scope: str, before: Rate, after: Rate
) -> None:
    """Issue 32 §11: a limit raised (and the workers restarted) admits runs at once, as
    its new rate allows; the stored reopen time was the old rate's."""
    job_type = "tests.limited_per_key" if scope == "key" else "tests.limited"
    for _ in range(5):
        JobRunFactory(job_type=job_type, pool="default", rate_key="customer:1")
    assert len(claim(limits_of_scope(scope, before))) == 1
    assert claim(limits_of_scope(scope, before)) == []
    assert limited.waiting(limits_of_scope(scope, before)) == {"default": 4}
    # The row still holds the old rate's reopen time; the new rate has room now.
    # (A restarted worker's first sweep releases the runs held under the old one.)
    if scope != "pool":
        assert rateholds.release_stranded(limits_of_scope(scope, after), [job_type], 0.5) == 4
    assert limited.waiting(limits_of_scope(scope, after)) == {}
    assert len(claim(limits_of_scope(scope, after))) == 4
    row = JobRateLimit.objects.get()
    assert (row.limit, row.period) == (after.count, after.seconds)
    assert row.open_at is None  # 5 starts of 10 (or 1000): room left


def test_a_window_closed_under_a_rate_stays_closed_under_that_rate() -> None:
    for _ in range(3):
        JobRunFactory(job_type="tests.limited")
    limits = Limits({"tests.limited": Rate(2, 3600.0)})
    assert len(claim(limits)) == 2
    # Rates built apart but equal (a restarted worker parses "2/h" again).
    assert claim(Limits({"tests.limited": Rate(2, 3600.0)})) == []
    assert limited.waiting(limits) == {"default": 1}


def test_a_limited_run_of_higher_priority_with_room_goes_before_unlimited_ones() -> None:
    """Issue 32 §10: priority holds across limited and unlimited runs."""
    urgent = [JobRunFactory(job_type="tests.limited", priority=100) for _ in range(5)]
    for _ in range(20):
        JobRunFactory(job_type="tests.noop")
    limits = Limits({"tests.limited": Rate(10, 1.0)})
    assert set(claim(limits, n=4)) < {run.pk for run in urgent}
    assert len(set(claim(limits, n=4)) & {run.pk for run in urgent}) == 1


def test_a_limited_run_with_room_is_not_starved_by_newer_unlimited_runs() -> None:
    """Of one priority, the oldest run first, whatever its limit (room allowing)."""
    first = JobRunFactory(job_type="tests.limited", run_at=timezone.now() - timedelta(seconds=5))
    for _ in range(20):
        JobRunFactory(job_type="tests.noop")
    assert first.pk in claim(Limits({"tests.limited": Rate(10, 1.0)}), n=2)


def test_a_limited_run_of_lower_priority_waits_for_the_unlimited_ones() -> None:
    low = JobRunFactory(job_type="tests.limited", priority=-5)
    plain = [JobRunFactory(job_type="tests.noop") for _ in range(4)]
    limits = Limits({"tests.limited": Rate(10, 1.0)})
    assert sorted(claim(limits, n=4)) == sorted(run.pk for run in plain)
    assert claim(limits, n=4) == [low.pk]


def test_a_limit_that_admits_fewer_than_picked_leaves_its_slots_to_other_runs() -> None:
    """The claim picks 4 limited runs of priority 9 first; their window admits 1; the
    other 3 slots go to the unlimited runs in the same claim, not at the next poll."""
    for _ in range(4):
        JobRunFactory(job_type="tests.limited", priority=9)
    plain = [JobRunFactory(job_type="tests.noop") for _ in range(4)]
    claimed = claim(Limits({"tests.limited": Rate(1, 3600.0)}), n=4)
    kinds = JobRun.objects.filter(pk__in=claimed).values_list("job_type", flat=True)
    assert sorted(kinds) == ["tests.limited", "tests.noop", "tests.noop", "tests.noop"]
    assert set(claimed) - {run.pk for run in plain} != set()
