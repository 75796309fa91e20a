"""Tenant caps (``DJANGO_JOBS["TENANT_CONCURRENCY"]``): at most N runs of one tenant
running at once in a pool, by the database (a slot per running run), claimed,
held and released by the cap."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction
from django.test import override_settings

from django_jobs import cancel, conf, start, start_many
from django_jobs.checks import check_settings
from django_jobs.models import Hold, JobRun, Status
from django_jobs.storage import claiming, holds, leases
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def capped(value: Any) -> Any:
    return override_settings(DJANGO_JOBS={"TENANT_CONCURRENCY": value})


@pytest.fixture
def cap_of_two() -> Iterator[None]:
    with capped({"default": 2}):
        yield


def claim(limit: int = 10, pools: list[str] | None = None) -> list[claiming.Claim]:
    return claiming.claim_batch(WorkerFactory().pk, pools or ["default"], limit)


def running(tenant: str, pool: str = "default") -> list[int | None]:
    rows = JobRun.objects.filter(status=Status.RUNNING, tenant_id=tenant, pool=pool)
    return sorted(rows.values_list("tenant_slot", flat=True))


def hold_of(run: JobRun) -> str:
    return str(JobRun.objects.values_list("hold", flat=True).get(pk=run.pk))


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, "from 1 to 10000, got 0"),
        (True, "got True"),
        ("3", "got '3'"),
        ({"reports": 0}, "TENANT_CONCURRENCY['reports'] must be a whole number"),
        ({3: 1}, "keys must be pool names or '*', got 3"),
    ],
)
def test_a_bad_cap_is_a_check_error_and_caps_nothing(value: Any, problem: str) -> None:
    with capped(value):
        errors = [m.msg for m in check_settings() if m.id == "django_jobs.E001"]
        assert any(problem in message for message in errors), errors
        assert conf.tenant_cap("default") is None


def test_a_cap_is_for_every_pool_or_by_pool_with_a_default() -> None:
    with capped(3):
        assert (conf.tenant_cap("default"), conf.tenant_cap("reports")) == (3, 3)
    with capped({"reports": 1}):
        assert (conf.tenant_cap("default"), conf.tenant_cap("reports")) == (None, 1)
    with capped({"reports": 1, "*": 5}):
        assert (conf.tenant_cap("default"), conf.tenant_cap("reports")) == (5, 1)
    assert conf.tenant_cap("default") is None


def test_a_claim_takes_no_more_runs_of_a_tenant_than_its_cap(
    cap_of_two: None, claim_forms: str
) -> None:
    busy = start_many("tests.noop", [{}] * 5, tenant_id="a")
    other = start("tests.noop", tenant_id="b")
    untenanted = start("tests.noop")
    batch = claim()
    assert sorted(c.run_id for c in batch) == sorted(
        [busy[0].pk, busy[1].pk, other.pk, untenanted.pk]
    )
    assert (running("a"), running("b")) == ([0, 1], [0])
    assert JobRun.objects.get(pk=untenanted.pk).tenant_slot is None
    assert claim() == []
    first = next(c for c in batch if c.run_id == busy[0].pk)
    assert leases.complete(first, None)
    assert [c.run_id for c in claim()] == [busy[2].pk]
    assert running("a") == [0, 1]


def test_the_database_refuses_a_slot_of_a_tenant_taken_twice() -> None:
    RunningJobRunFactory(tenant_id="a", tenant_slot=0)
    other = JobRunFactory(tenant_id="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=other.pk).update(status=Status.RUNNING, tenant_slot=0)
    # The same slot of the tenant in another pool is another slot.
    elsewhere = JobRunFactory(tenant_id="a", pool="reports")
    JobRun.objects.filter(pk=elsewhere.pk).update(status=Status.RUNNING, tenant_slot=0)


def test_a_cap_by_pool_leaves_the_other_pools_alone(claim_forms: str) -> None:
    with capped({"reports": 1}):
        start_many("tests.noop", [{}] * 3, tenant_id="a")
        start_many("tests.noop", [{}] * 3, tenant_id="a", pool="reports")
        assert len(claim(10, ["default", "reports"])) == 4
        assert running("a", "reports") == [0]
        uncapped = JobRun.objects.filter(status=Status.RUNNING, tenant_id="a", pool="default")
        assert list(uncapped.values_list("tenant_slot", flat=True)) == [None] * 3


def test_runs_of_a_tenant_at_its_cap_are_held_at_start_and_released_one_per_end(
    cap_of_two: None,
) -> None:
    start_many("tests.noop", [{}] * 2, tenant_id="a")
    first, _ = claim()
    held = start_many("tests.noop", [{}] * 3, tenant_id="a")
    assert {hold_of(run) for run in held} == {Hold.TENANT}
    # Another tenant's runs are not held.
    assert hold_of(start("tests.noop", tenant_id="b")) == Hold.READY
    assert leases.complete(first, None)
    assert [hold_of(run) for run in held] == [Hold.READY, Hold.TENANT, Hold.TENANT]
    # A held run canceled is gone; the ready one canceled releases the next.
    assert cancel(held[0].pk) == 1
    assert [hold_of(run) for run in held[1:]] == [Hold.READY, Hold.TENANT]


def test_the_workers_pass_holds_a_burst_and_the_sweep_releases_by_room(
    cap_of_two: None,
) -> None:
    RunningJobRunFactory(tenant_id="a", tenant_slot=0)
    RunningJobRunFactory(tenant_id="a", tenant_slot=1)
    RunningJobRunFactory(tenant_id="b", tenant_slot=0)
    burst = [JobRunFactory(tenant_id="a") for _ in range(3)]
    roomy = [JobRunFactory(tenant_id="b") for _ in range(2)]
    assert holds.hold_taken() == 3
    assert {hold_of(run) for run in burst} == {Hold.TENANT}
    assert {hold_of(run) for run in roomy} == {Hold.READY}
    # Held by hand, as a crash between a start and its release leaves them: the
    # sweep makes ready as many as there is room for (2 - 1 running).
    JobRun.objects.filter(pk__in=[r.pk for r in roomy]).update(hold=Hold.TENANT)
    assert holds.release_stranded() == 1
    assert holds.release_stranded() == 0


def test_runs_held_for_a_cap_since_removed_are_released_by_the_sweep(cap_of_two: None) -> None:
    RunningJobRunFactory(tenant_id="a", tenant_slot=0)
    RunningJobRunFactory(tenant_id="a", tenant_slot=1)
    held = start_many("tests.noop", [{}] * 4, tenant_id="a")
    assert {hold_of(run) for run in held} == {Hold.TENANT}
    with override_settings(DJANGO_JOBS={}):
        assert holds.release_stranded() == 4
        assert len(claim()) == 4


def test_racing_claimers_never_run_more_of_a_tenant_than_its_cap(
    cap_of_two: None, claim_forms: str
) -> None:
    for round_ in range(10):
        JobRun.objects.all().delete()
        workers = [WorkerFactory() for _ in range(6)]
        for n in range(60):
            JobRunFactory(tenant_id=f"t{n % 3}")
        barrier = threading.Barrier(len(workers))

        def claim_once(worker_id: Any, barrier: threading.Barrier = barrier) -> list[int]:
            try:
                with capped({"default": 2}):
                    barrier.wait(10)
                    return [c.run_id for c in claiming.claim_batch(worker_id, ["default"], 10)]
            finally:
                connections.close_all()

        with ThreadPoolExecutor(len(workers)) as pool:
            claimed = [i for got in pool.map(claim_once, [w.pk for w in workers]) for i in got]
        assert JobRun.objects.filter(status=Status.RUNNING).count() == len(claimed) <= 6
        for tenant in ("t0", "t1", "t2"):
            assert set(running(tenant)) <= {0, 1}, (round_, tenant)
            assert len(running(tenant)) <= 2, (round_, tenant)


def test_drain_runs_every_run_of_a_capped_tenant(cap_of_two: None) -> None:
    from django_jobs.testing import drain

    start_many("tests.noop", [{}] * 7, tenant_id="a")
    assert drain() == 7
    assert JobRun.objects.filter(status=Status.COMPLETED, hold=Hold.READY).count() == 7


def test_operators_see_what_a_run_held_for_its_tenant_waits_for(
    admin_client: Any, cap_of_two: None
) -> None:
    """The run page names the runs that fill the tenant's cap; the pools page,
    jobstatus (text and JSON) and the metrics count the runs held for a cap."""
    import html
    import json
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse
    from prometheus_client import CollectorRegistry

    from django_jobs import metrics

    holders = [RunningJobRunFactory(tenant_id="a", tenant_slot=n) for n in range(2)]
    held = start_many("tests.noop", [{}] * 3, tenant_id="a")
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[held[0].pk]))
    content = html.unescape(page.content.decode())
    assert "its tenant's cap of 2 runs in this pool, which" in content
    named = content.split("its tenant's cap of 2 runs")[1][:800]
    assert all(f"/{holder.pk}/change/" in named for holder in holders)
    pools = admin_client.get(reverse("admin:django_jobs_jobrun_pools")).content.decode()
    assert "(3 wait for their tenant's cap)" in html.unescape(pools)
    out = StringIO()
    call_command("jobstatus", stdout=out)
    assert "default held: 3 pending runs wait for their tenant's cap" in out.getvalue()
    out = StringIO()
    call_command("jobstatus", "--json", stdout=out)
    (default,) = [p for p in json.loads(out.getvalue())["pools"] if p["pool"] == "default"]
    assert (default["held_for_tenant"], default["held_for_key"]) == (3, 0)
    registry = CollectorRegistry()
    metrics.install(registry)
    labels = {"pool": "default", "reason": "tenant"}
    assert registry.get_sample_value("django_jobs_queue_held_runs", labels) == 3
    # A slot freed, the run not yet released: the page says it is next.
    JobRun.objects.filter(pk=holders[0].pk).update(status=Status.COMPLETED, lease_token=None)
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[held[0].pk]))
    assert "with room now: it is released next" in page.content.decode()
