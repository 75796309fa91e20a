"""Concurrency keys and idempotency keys under real concurrent connections."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import IntegrityError, connections, transaction

from django_jobs import start
from django_jobs.models import JobRun, Status
from django_jobs.storage import claiming, leases
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_database_refuses_two_running_runs_of_one_key() -> None:
    RunningJobRunFactory(concurrency_key="order:1")
    other = JobRunFactory(concurrency_key="order:1")
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=other.pk).update(status=Status.RUNNING)


def test_a_blocked_run_is_skipped_and_the_claim_takes_others() -> None:
    worker = WorkerFactory()
    RunningJobRunFactory(concurrency_key="order:1")
    blocked = JobRunFactory(concurrency_key="order:1", priority=10)
    free = JobRunFactory(concurrency_key="order:2")
    plain = JobRunFactory()
    claimed = {c.run_id for c in claiming.claim_batch(worker.pk, ["default"], 10)}
    assert claimed == {free.pk, plain.pk}
    assert JobRun.objects.get(pk=blocked.pk).status == Status.PENDING


def test_one_batch_takes_one_run_per_key() -> None:
    worker = WorkerFactory()
    runs = [JobRunFactory(concurrency_key="k") for _ in range(5)]
    batch = claiming.claim_batch(worker.pk, ["default"], 10)
    assert [c.run_id for c in batch] == [runs[0].pk]
    assert claiming.claim_batch(worker.pk, ["default"], 10) == []
    assert leases.complete(batch[0], None)
    assert [c.run_id for c in claiming.claim_batch(worker.pk, ["default"], 10)] == [runs[1].pk]


def test_racing_claimers_never_run_one_key_twice() -> None:
    workers = [WorkerFactory() for _ in range(6)]
    for n in range(60):
        JobRunFactory(concurrency_key=f"key:{n % 3}")
    barrier = threading.Barrier(len(workers))

    def claim_once(worker_id: object) -> list[int]:
        try:
            barrier.wait(10)
            return [c.run_id for c in claiming.claim_batch(worker_id, ["default"], 10)]  # type: ignore[arg-type]
        finally:
            connections.close_all()

    with ThreadPoolExecutor(len(workers)) as pool:
        claimed = [i for got in pool.map(claim_once, [w.pk for w in workers]) for i in got]
    running = JobRun.objects.filter(status=Status.RUNNING)
    assert running.count() == len(claimed) <= 3
    assert len(set(running.values_list("concurrency_key", flat=True))) == running.count()


def test_racing_starts_with_one_idempotency_key_create_one_run() -> None:
    barrier = threading.Barrier(20)

    def start_once(n: int) -> int:
        try:
            barrier.wait(10)
            return start("tests.noop", {"n": n}, idempotency_key="charge-7").pk
        finally:
            connections.close_all()

    with ThreadPoolExecutor(20) as pool:
        ids = list(pool.map(start_once, range(20)))
    assert len(set(ids)) == 1
    assert JobRun.objects.filter(idempotency_key="charge-7").count() == 1


def test_an_idempotent_start_rolled_back_leaves_the_key_free() -> None:
    def start_then_roll_back() -> None:
        with transaction.atomic():
            start("tests.noop", idempotency_key="k")
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        start_then_roll_back()
    run = start("tests.noop", {"second": True}, idempotency_key="k")
    assert JobRun.objects.get(idempotency_key="k").pk == run.pk


def test_an_idempotency_key_is_scoped_by_tenant() -> None:
    acme = start("tests.noop", {"secret": "acme"}, idempotency_key="invoice-1", tenant_id="acme")
    globex = start("tests.noop", {"mine": 1}, idempotency_key="invoice-1", tenant_id="globex")
    untenanted = start("tests.noop", {"plain": 1}, idempotency_key="invoice-1")
    assert len({acme.pk, globex.pk, untenanted.pk}) == 3
    assert globex.input == {"mine": 1}
    # Each tenant (and no tenant) still gets its own run back for its key.
    assert start("tests.noop", idempotency_key="invoice-1", tenant_id="globex").pk == globex.pk
    assert start("tests.noop", idempotency_key="invoice-1", tenant_id="acme").pk == acme.pk
    assert start("tests.noop", idempotency_key="invoice-1").pk == untenanted.pk
    assert JobRun.objects.filter(idempotency_key="invoice-1").count() == 3


def test_racing_starts_of_two_tenants_with_one_key_create_one_run_each() -> None:
    barrier = threading.Barrier(20)

    def start_once(n: int) -> tuple[str, int]:
        tenant = ("acme", "globex")[n % 2]
        try:
            barrier.wait(10)
            run = start("tests.noop", {"n": n}, idempotency_key="charge-7", tenant_id=tenant)
            return tenant, run.pk
        finally:
            connections.close_all()

    with ThreadPoolExecutor(20) as pool:
        got = list(pool.map(start_once, range(20)))
    by_tenant = {tenant: {pk for t, pk in got if t == tenant} for tenant in ("acme", "globex")}
    assert all(len(ids) == 1 for ids in by_tenant.values()), by_tenant
    assert by_tenant["acme"] != by_tenant["globex"]
    for tenant, (pk,) in by_tenant.items():
        assert JobRun.objects.get(pk=pk).tenant_id == tenant
