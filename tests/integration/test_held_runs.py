"""Runs held while their concurrency key is taken: out of the claim's way, released
by what frees the key, never held for good while it is free (``storage.holds``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_jobs import cancel, start, start_many
from django_jobs.models import Hold, JobRun, Status
from django_jobs.storage import claiming, holds, leases
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory
from tests.integration.test_claim_statistics import (
    BUDGET,
    _explained,
    _handler_reads,
    record_statements,
)

pytestmark = pytest.mark.django_db(transaction=True)


def hold_of(run: JobRun | int) -> str:
    pk = run if isinstance(run, int) else run.pk
    return str(JobRun.objects.values_list("hold", flat=True).get(pk=pk))


def claim(limit: int = 10) -> list[claiming.Claim]:
    return claiming.claim_batch(WorkerFactory().pk, ["default"], limit)


def test_a_run_started_while_its_key_is_taken_is_held_and_released_when_it_frees() -> None:
    start("tests.keyed", {"key": "k"})
    (first,) = claim(1)
    second = start("tests.keyed", {"key": "k"})
    other = start("tests.keyed", {"key": "other"})
    assert hold_of(second) == Hold.KEY
    assert hold_of(other) == Hold.READY
    assert [c.run_id for c in claim()] == [other.pk]
    assert leases.complete(first, None)
    assert hold_of(second) == Hold.READY
    assert [c.run_id for c in claim()] == [second.pk]


def test_held_runs_are_released_one_at_a_time_in_claim_order() -> None:
    running = RunningJobRunFactory(concurrency_key="k")
    low = start_many("tests.keyed", [{"key": "k"}, {"key": "k"}])
    high = start("tests.keyed", {"key": "k"}, priority=5)
    assert {hold_of(run) for run in [*low, high]} == {Hold.KEY}
    JobRun.objects.filter(pk=running.pk).update(status=Status.COMPLETED, lease_token=None)
    assert holds.release(holds.KEY, [("k",)]) == 1
    assert hold_of(high) == Hold.READY
    # Released already, not yet claimed: the next release leaves the others held.
    assert holds.release(holds.KEY, [("k",)]) == 0
    order = []
    for _ in range(3):
        (taken,) = claim()
        order.append(taken.run_id)
        assert claim() == []
        assert leases.complete(taken, None)
    assert order == [high.pk, low[0].pk, low[1].pk]
    assert not JobRun.objects.exclude(hold=Hold.READY).filter(status=Status.PENDING).exists()


def test_a_burst_started_while_the_key_was_free_is_held_once_the_key_is_taken() -> None:
    runs = start_many("tests.keyed", [{"key": "k"} for _ in range(5)] + [{"key": "free"}])
    taken = claim(1)
    assert [c.run_id for c in taken] == [runs[0].pk]
    assert holds.hold_taken() == 4
    assert [hold_of(run) for run in runs[1:]] == [Hold.KEY] * 4 + [Hold.READY]
    assert holds.hold_taken() == 0
    assert leases.complete(taken[0], None)
    assert [hold_of(run) for run in runs[1:5]] == [Hold.READY] + [Hold.KEY] * 3


def test_a_release_lost_to_a_crash_is_made_by_the_sweep() -> None:
    runs = start_many("tests.keyed", [{"key": "k"}, {"key": "k"}, {"key": "j"}])
    # As if the run holding each key had ended, and its worker died before releasing.
    JobRun.objects.filter(pk__in=[run.pk for run in runs]).update(hold=Hold.KEY)
    RunningJobRunFactory(concurrency_key="j")
    assert holds.release_stranded() == 1
    assert [hold_of(run) for run in runs] == [Hold.READY, Hold.KEY, Hold.KEY]
    assert holds.release_stranded() == 0


def test_a_held_run_can_be_canceled_and_canceling_the_ready_one_releases_the_next() -> None:
    RunningJobRunFactory(concurrency_key="k")
    held = start_many("tests.keyed", [{"key": "k"} for _ in range(3)])
    assert cancel(held[0].pk) == 1
    assert JobRun.objects.get(pk=held[0].pk).status == Status.CANCELED
    JobRun.objects.filter(status=Status.RUNNING).update(status=Status.COMPLETED, lease_token=None)
    assert holds.release(holds.KEY, [("k",)]) == 1
    assert hold_of(held[1]) == Hold.READY
    # The ready run is canceled before any claim took it: the next one is released.
    assert cancel(held[1].pk) == 1
    assert hold_of(held[2]) == Hold.READY


def test_runs_due_later_are_not_held_at_start() -> None:
    RunningJobRunFactory(concurrency_key="k")
    later = start("tests.keyed", {"key": "k"}, delay=3600)
    assert hold_of(later) == Hold.READY


def test_a_run_started_in_a_transaction_rolled_back_releases_nothing() -> None:
    RunningJobRunFactory(concurrency_key="k")
    with transaction.atomic():
        start("tests.keyed", {"key": "k"})
        transaction.set_rollback(True)
    assert not JobRun.objects.filter(status=Status.PENDING).exists()


@pytest.mark.parametrize("rounds", [40])
def test_a_key_freed_while_a_run_of_it_starts_never_leaves_that_run_held(rounds: int) -> None:
    """The lost wake-up: the start reads the key taken, the end frees it before the
    start commits. Whichever commits last releases the run."""
    if connection.vendor == "sqlite":
        pytest.skip("one writer at a time: the two cannot overlap")
    stranded = [n for n in range(rounds) if hold_of(_start_while_freed(f"race:{n}")) != Hold.READY]
    assert stranded == []


def _start_while_freed(key: str) -> int:
    """Start a run of ``key`` in a transaction while its running run ends; its id."""
    JobRunFactory(concurrency_key=key)
    (running,) = claim(1)
    barrier = threading.Barrier(2)
    started: list[int] = []

    def starter() -> None:
        try:
            with transaction.atomic():
                started.append(start("tests.keyed", {"key": key}).pk)
                barrier.wait(10)
        finally:
            connections.close_all()

    def ender() -> None:
        try:
            barrier.wait(10)
            leases.complete(running, None)
        finally:
            connections.close_all()

    both = [threading.Thread(target=starter), threading.Thread(target=ender)]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(30)
    (run_id,) = started
    return run_id


def _claim_reads(claim_of_16: Callable[[], Any]) -> int:
    """Rows the claim of 16 read: PostgreSQL's plan, MySQL's and MariaDB's handler."""
    if connection.vendor == "postgresql":
        with pytest.MonkeyPatch.context() as monkeypatch:
            seen = record_statements(monkeypatch)
            assert len(claim_of_16()) == 16
        (claimed,) = [(sql, params) for sql, params in seen if "django_jobs claim" in sql]
        return _explained(*claimed)
    before = _handler_reads()
    assert len(claim_of_16()) == 16
    return _handler_reads() - before


@pytest.mark.parametrize("when", ["at start", "by the worker"])
def test_a_claim_reads_none_of_20000_runs_held_behind_a_taken_key(when: str) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("rows read are counted on PostgreSQL, MySQL and MariaDB")
    if when == "at start":
        RunningJobRunFactory(concurrency_key="busy")
        held = start_many("tests.keyed", [{"key": "busy"} for _ in range(20_000)])
    else:
        held = start_many("tests.keyed", [{"key": "busy"} for _ in range(20_001)])
        claim(1)
        while holds.hold_taken():
            pass
        held = held[1:]
    assert JobRun.objects.filter(hold=Hold.KEY).count() == len(held) == 20_000
    start_many("tests.noop", [{} for _ in range(16)])
    with connection.cursor() as cursor:
        cursor.execute(
            f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}django_jobs_jobrun"
        )
    worker = WorkerFactory().pk
    assert _claim_reads(lambda: claiming.claim_batch(worker, ["default"], 16)) < BUDGET


@pytest.fixture
def keyed_family() -> Any:
    """A parent that starts a child of its own concurrency key and waits for it:
    the child is held while the parent runs, released when the parent waits."""
    from django_jobs import JobContext, job
    from django_jobs.registry import unregister

    @job("held.child", concurrency_key=lambda input: input["key"])
    def child(ctx: JobContext) -> Any:
        return ctx.input["n"] * 2

    @job("held.parent", concurrency_key=lambda input: input["key"])
    def parent(ctx: JobContext) -> Any:
        kids = [ctx.spawn_child("held.child", {"key": ctx.input["key"], "n": n}) for n in (1, 2)]
        return sum(ctx.wait_for(kids))

    yield
    unregister("held.child")
    unregister("held.parent")


@pytest.mark.django_db(transaction=False)
@pytest.mark.usefixtures("keyed_family")
def test_drain_in_a_test_transaction_releases_what_no_commit_will() -> None:
    """Inside a test's transaction no commit comes, so nothing released after one:
    ``drain()`` releases held runs of free keys itself."""
    from django_jobs.testing import drain

    run = start("held.parent", {"key": "family"})
    assert drain() == 4  # the parent, its two children, the parent again
    assert JobRun.objects.get(pk=run.pk).output == 6


def test_operators_see_what_a_held_run_waits_for(admin_client: Any) -> None:
    """The run page names the run that holds the key; the pools page, jobstatus (text
    and JSON) and the metrics count the held runs apart from the ready ones."""
    import json
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse
    from prometheus_client import CollectorRegistry

    from django_jobs import metrics

    holder = RunningJobRunFactory(concurrency_key="k", job_type="tests.keyed", pool="mail")
    held = start_many("tests.keyed", [{"key": "k"}] * 3, pool="mail")
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[held[0].pk]))
    content = page.content.decode()
    assert "its concurrency key, which" in content
    assert f"/{holder.pk}/change/" in content.split("its concurrency key, which")[1][:400]
    pools = admin_client.get(reverse("admin:django_jobs_jobrun_pools")).content.decode()
    assert "(3 wait for their key)" in pools
    out = StringIO()
    call_command("jobstatus", stdout=out)
    assert "mail held: 3 pending runs wait for their concurrency key" in out.getvalue()
    out = StringIO()
    call_command("jobstatus", "--json", stdout=out)
    (mail,) = [pool for pool in json.loads(out.getvalue())["pools"] if pool["pool"] == "mail"]
    assert (mail["counts"]["pending"], mail["held_for_key"]) == (3, 3)
    registry = CollectorRegistry()
    metrics.install(registry)
    assert (
        registry.get_sample_value("django_jobs_queue_held_runs", {"pool": "mail", "reason": "key"})
        == 3
    )
    # Free, not yet released: the page says it is next.
    JobRun.objects.filter(pk=holder.pk).update(status=Status.COMPLETED, lease_token=None)
    page = admin_client.get(reverse("admin:django_jobs_jobrun_change", args=[held[0].pk]))
    assert "free now: it is released next" in page.content.decode()


def test_the_workers_hold_pass_leaves_runs_due_later_ready() -> None:
    RunningJobRunFactory(concurrency_key="k")
    later = start("tests.keyed", {"key": "k"}, delay=3600)
    JobRun.objects.filter(pk=later.pk).update(hold=Hold.READY)
    assert holds.hold_taken() == 0
    JobRun.objects.filter(pk=later.pk).update(run_at=timezone.now())
    assert holds.hold_taken() == 1


def test_a_claim_for_several_pools_takes_them_in_one_claim_order() -> None:
    worker = WorkerFactory().pk
    low_a = start("tests.noop", pool="a")
    high_b = start("tests.noop", pool="b", priority=5)
    old_b = start("tests.noop", pool="b", run_at=timezone.now() - timedelta(hours=1))
    high_c = start("tests.noop", pool="c", priority=9)
    taken = claiming.claim_batch(worker, ["a", "b"], 2)
    assert [c.run_id for c in taken] == [high_b.pk, old_b.pk]
    assert [c.run_id for c in claiming.claim_batch(worker, ["b", "a"], 5)] == [low_a.pk]
    assert hold_of(high_c) == Hold.READY
    assert JobRun.objects.get(pk=high_c.pk).status == Status.PENDING


def test_a_claim_for_several_pools_passes_over_a_paused_one() -> None:
    from django_jobs.pools import pause_pool, resume_pool

    worker = WorkerFactory().pk
    parked = start("tests.noop", pool="parked", priority=9)
    ready = start("tests.noop", pool="default")
    pause_pool("parked")
    assert [c.run_id for c in claiming.claim_batch(worker, ["default", "parked"], 5)] == [ready.pk]
    resume_pool("parked")
    assert [c.run_id for c in claiming.claim_batch(worker, ["default", "parked"], 5)] == [parked.pk]


@pytest.mark.parametrize("backlog", ["paused", "other pool"])
def test_a_claim_for_several_pools_reads_none_of_another_pools_backlog(backlog: str) -> None:
    """20,000 runs of a paused pool the worker serves, or of an older backlog in its
    other pool: a claim of 16 from the first pool reads what it takes."""
    from django_jobs.pools import pause_pool

    if connection.vendor == "sqlite":
        pytest.skip("rows read are counted on PostgreSQL, MySQL and MariaDB")
    if backlog == "paused":
        pause_pool("parked")
        start_many("tests.noop", [{} for _ in range(20_000)], pool="parked")
        start_many("tests.noop", [{} for _ in range(16)])
    else:
        # Every run of "parked" comes after the 16 of "default" in claim order.
        start_many("tests.noop", [{} for _ in range(16)], priority=1)
        start_many("tests.noop", [{} for _ in range(20_000)], pool="parked")
    with connection.cursor() as cursor:
        cursor.execute(
            f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}django_jobs_jobrun"
        )
    worker = WorkerFactory().pk
    reads = _claim_reads(lambda: claiming.claim_batch(worker, ["default", "parked"], 16))
    assert reads < BUDGET


def test_a_release_reads_a_key_once_not_each_run_held_for_it() -> None:
    """The keys with held runs are found with DISTINCT and no ordering: ordered by
    id (the model's ordering), DISTINCT would return, and read, every held run."""
    from django.db import connection as conn
    from django.test.utils import CaptureQueriesContext

    RunningJobRunFactory(concurrency_key="k")
    start_many("tests.keyed", [{"key": "k"}] * 3)
    with CaptureQueriesContext(conn) as queries:
        assert holds.release(holds.KEY, [("k",)]) == 0
    (found,) = [q["sql"] for q in queries if "DISTINCT" in q["sql"]]
    assert "ORDER BY" not in found


def test_a_run_held_between_a_claims_pick_and_its_lock_is_not_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two-statement claim picks ready runs, then locks them by id: a run the
    worker's hold pass held in between stays pending and held, not run held."""
    held, free = start("tests.keyed", {"key": "k"}), start("tests.noop")
    real_locked = claiming._locked

    def held_meanwhile(ids: list[int]) -> list[dict[str, Any]]:
        JobRun.objects.filter(pk=held.pk).update(hold=Hold.KEY)
        return real_locked(ids)

    monkeypatch.setattr(claiming, "_locked", held_meanwhile)
    picked = claiming.candidates(["default"], locked=False)
    claimed = claiming.claim_two_statements(WorkerFactory().pk, picked, 10)
    assert [c.run_id for c in claimed] == [free.pk]
    assert (JobRun.objects.get(pk=held.pk).status, hold_of(held)) == (Status.PENDING, Hold.KEY)
