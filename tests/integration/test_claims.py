"""Claiming, fencing, rescue and release against real PostgreSQL connections."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, OperationalError, connections, transaction
from django.utils import timezone

from django_jobs import start_many, transitions
from django_jobs.models import JobRun, JobStep, Status, Worker, WorkerStatus
from django_jobs.storage import claiming, leases, workers
from django_jobs.storage.claiming import Claim
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(fn: Any) -> Any:
    """Run ``fn`` on another thread, hence another database connection."""

    def wrapper(*args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            connections.close_all()

    return wrapper


def test_skip_locked_passes_over_rows_another_transaction_is_claiming() -> None:
    worker_a, worker_b = WorkerFactory(), WorkerFactory()
    start_many("tests.noop", [{} for _ in range(10)])
    a_claimed = threading.Event()
    b_done = threading.Event()
    result: dict[str, list[int]] = {}

    @in_thread
    def claimer_a() -> None:
        # Hold the claim transaction open until B has claimed: A's rows stay locked.
        with transaction.atomic():
            result["a"] = [c.run_id for c in claiming.claim_batch(worker_a.pk, ["default"], 4)]
            a_claimed.set()
            assert b_done.wait(10)

    @in_thread
    def claimer_b() -> None:
        assert a_claimed.wait(10)
        result["b"] = [c.run_id for c in claiming.claim_batch(worker_b.pk, ["default"], 10)]
        b_done.set()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(claimer_a), pool.submit(claimer_b)]
        for future in futures:
            future.result(timeout=20)
    assert len(result["a"]) == 4
    assert len(result["b"]) == 6
    assert not set(result["a"]) & set(result["b"])
    assert set(JobRun.objects.values_list("claimed_by_id", flat=True)) == {worker_a.pk, worker_b.pk}


def test_racing_claimers_never_share_a_run() -> None:
    workers = [WorkerFactory() for _ in range(6)]
    ids = {run.pk for run in start_many("tests.noop", [{} for _ in range(600)])}

    @in_thread
    def drain_ids(worker: Worker) -> list[int]:
        got: list[int] = []
        while batch := claiming.claim_batch(worker.pk, ["default"], 7):
            got.extend(c.run_id for c in batch)
        return got

    with ThreadPoolExecutor(len(workers)) as pool:
        results = list(pool.map(drain_ids, workers, timeout=60))
    claimed = [run_id for got in results for run_id in got]
    assert len(claimed) == len(set(claimed)) == 600
    assert set(claimed) == ids
    assert sum(1 for got in results if got) > 1, "expected the claims to interleave"


def test_batch_honours_priority_then_run_at_and_skips_future_runs() -> None:
    now = timezone.now()
    late_high = JobRunFactory(priority=5, run_at=now - timedelta(seconds=1))
    early_high = JobRunFactory(priority=5, run_at=now - timedelta(seconds=10))
    low = JobRunFactory(priority=-1, run_at=now - timedelta(hours=1))
    mid = JobRunFactory(priority=0, run_at=now - timedelta(seconds=5))
    JobRunFactory(priority=9, run_at=now + timedelta(hours=1))  # not due
    JobRunFactory(priority=9, pool="elsewhere")  # other pool
    JobRunFactory(priority=9, status=Status.COMPLETED)
    worker = WorkerFactory()
    batch = claiming.claim_batch(worker.pk, ["default"], 3)
    assert [c.run_id for c in batch] == [early_high.pk, late_high.pk, mid.pk]
    assert [c.run_id for c in claiming.claim_batch(worker.pk, ["default"], 3)] == [low.pk]


def test_claim_counts_the_attempt_and_takes_a_lease() -> None:
    worker = WorkerFactory()
    run = JobRunFactory(attempts=1)
    (claim,) = claiming.claim_batch(worker.pk, ["default"], 5)
    run.refresh_from_db()
    assert (run.status, run.attempts, claim.attempt) == (Status.RUNNING, 2, 2)
    assert run.claimed_by_id == worker.pk
    assert run.lease_token == claim.lease_token
    assert run.started_at is not None


@pytest.mark.postgresql("partial indexes (MySQL and MariaDB: test_mysql.py)")
def test_claim_is_served_by_the_partial_index() -> None:
    start_many("tests.noop", [{} for _ in range(2000)])
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE django_jobs_jobrun")
    query = (
        JobRun.objects.filter(
            status="pending",
            hold="",
            pool__in=["default"],
            is_async=False,
            run_at__lte=timezone.now(),
        )
        .order_by("-priority", "turn", "run_at")
        .values("id")[:10]
    )
    with transaction.atomic():
        with connections["default"].cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
        plan = query.explain()
    assert "django_jobs_run_claim_kind" in plan
    assert "Sort" not in plan


def test_a_claim_passes_over_the_runs_another_claim_holds_even_when_they_are_all_it_picked() -> (
    None
):
    worker_a, worker_b = WorkerFactory(), WorkerFactory()
    start_many("tests.noop", [{} for _ in range(10)])
    a_claimed, b_done = threading.Event(), threading.Event()
    result: dict[str, list[int]] = {}

    def claimer_a() -> None:
        # Holds the first four runs in claim order, uncommitted, while B claims four.
        with transaction.atomic():
            result["a"] = [c.run_id for c in claiming.claim_batch(worker_a.pk, ["default"], 4)]
            a_claimed.set()
            assert b_done.wait(10)

    def claimer_b() -> None:
        assert a_claimed.wait(10)
        result["b"] = [c.run_id for c in claiming.claim_batch(worker_b.pk, ["default"], 4)]
        b_done.set()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(in_thread(claimer_a)), pool.submit(in_thread(claimer_b))]
        for future in futures:
            future.result(timeout=20)
    assert len(result["a"]) == 4
    assert len(result["b"]) == 4
    assert not set(result["a"]) & set(result["b"])


def fenced_claim() -> tuple[Claim, JobRun]:
    worker = WorkerFactory()
    JobRunFactory()
    (claim,) = claiming.claim_batch(worker.pk, ["default"], 1)
    return claim, JobRun.objects.get(pk=claim.run_id)


@pytest.mark.parametrize(
    "write",
    [
        lambda c: leases.complete(c, {"late": True}),
        lambda c: leases.end(c, Status.FAILED, {"type": "X"}),
        lambda c: leases.reschedule(c, {"type": "X"}, 0),
    ],
    ids=["complete", "fail", "reschedule"],
)
def test_writes_after_the_lease_changed_write_nothing(write: Any) -> None:
    claim, run = fenced_claim()
    # Another worker rescued and re-claimed the run: the lease token changed.
    new_token = uuid.uuid4()
    JobRun.objects.filter(pk=run.pk).update(lease_token=new_token)
    assert write(claim) is False
    run.refresh_from_db()
    assert (run.status, run.lease_token, run.output, run.error) == (
        Status.RUNNING,
        new_token,
        None,
        None,
    )


def test_writes_after_the_run_left_running_write_nothing() -> None:
    claim, run = fenced_claim()
    JobRun.objects.filter(pk=run.pk).update(status=Status.CANCELED, lease_token=None)
    assert leases.complete(claim, {"late": True}) is False
    run.refresh_from_db()
    assert (run.status, run.output) == (Status.CANCELED, None)


def test_a_lease_token_exists_only_on_a_running_run() -> None:
    # Fencing on the token alone (leases.fenced, batched completion, steps)
    # relies on this constraint: a token always means running.
    claim, run = fenced_claim()
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=run.pk).update(status=Status.CANCELED)
    JobRun.objects.filter(pk=run.pk).update(status=Status.CANCELED, lease_token=None)
    assert leases.complete(claim, {"late": True}) is False


def test_fenced_writes_land_while_the_lease_holds() -> None:
    claim, run = fenced_claim()
    assert leases.complete(claim, {"ok": 1}) is True
    run.refresh_from_db()
    assert (run.status, run.output, run.lease_token) == (Status.COMPLETED, {"ok": 1}, None)
    assert run.finished_at is not None


def make_stale(worker: Worker, seconds: float = 3600) -> None:
    Worker.objects.filter(pk=worker.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_rescue_takes_only_stale_workers_runs() -> None:
    stale, live = WorkerFactory(), WorkerFactory()
    make_stale(stale)
    lost_retry = RunningJobRunFactory(claimed_by=stale, attempts=1, max_attempts=3)
    lost_spent = RunningJobRunFactory(claimed_by=stale, attempts=3, max_attempts=3)
    long_running = RunningJobRunFactory(
        claimed_by=live, started_at=timezone.now() - timedelta(days=2)
    )
    other_pool = RunningJobRunFactory(claimed_by=stale, pool="elsewhere")
    assert transitions.rescue_stale(["default"], stale_after=60) == (1, 1)
    for run in (lost_retry, lost_spent, long_running, other_pool):
        run.refresh_from_db()
    assert (lost_retry.status, lost_retry.attempts, lost_retry.lease_token) == (
        Status.PENDING,
        1,
        None,
    )
    assert lost_spent.status == Status.FAILED
    assert lost_spent.error["type"] == "django_jobs.exceptions.WorkerLost"
    assert long_running.status == Status.RUNNING
    assert other_pool.status == Status.RUNNING
    assert Worker.objects.get(pk=stale.pk).status == WorkerStatus.LOST
    assert Worker.objects.get(pk=live.pk).status == WorkerStatus.RUNNING


def test_recent_heartbeat_is_not_stale() -> None:
    worker = WorkerFactory()
    make_stale(worker, seconds=30)
    run = RunningJobRunFactory(claimed_by=worker)
    assert transitions.rescue_stale(["default"], stale_after=60) == (0, 0)
    run.refresh_from_db()
    assert run.status == Status.RUNNING


def test_parallel_sweepers_rescue_each_run_once() -> None:
    stale = WorkerFactory()
    make_stale(stale)
    for _ in range(40):
        RunningJobRunFactory(claimed_by=stale, max_attempts=5)

    @in_thread
    def sweep(_: int) -> tuple[int, int]:
        return transitions.rescue_stale(None, stale_after=60)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(sweep, range(4), timeout=30))
    assert sum(requeued for requeued, _ in results) == 40
    assert JobRun.objects.filter(status=Status.PENDING).count() == 40


def test_release_gives_back_only_own_runs_without_spending_attempts() -> None:
    me, other = WorkerFactory(), WorkerFactory()
    JobRunFactory.create_batch(2)
    mine = claiming.claim_batch(me.pk, ["default"], 2)
    theirs = RunningJobRunFactory(claimed_by=other)
    forged = Claim(run_id=theirs.pk, attempt=1, lease_token=theirs.lease_token)
    assert leases.release(me.pk, [*mine, forged]) == 2
    theirs.refresh_from_db()
    assert theirs.status == Status.RUNNING
    for claim in mine:
        run = JobRun.objects.get(pk=claim.run_id)
        assert (run.status, run.attempts, run.claimed_by_id) == (Status.PENDING, 0, None)


def test_heartbeat_updates_the_worker_row() -> None:
    worker = WorkerFactory()
    make_stale(worker)
    assert workers.heartbeat(worker.pk, WorkerStatus.STOPPING) is True
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPING
    assert timezone.now() - worker.heartbeat_at < timedelta(minutes=1)
    assert workers.heartbeat(uuid.uuid4(), WorkerStatus.RUNNING) is False


def test_a_rescued_run_without_attempts_closes_its_children_and_wakes_its_parent() -> None:
    stale = WorkerFactory()
    make_stale(stale)
    parent = JobRunFactory(status=Status.WAITING)
    lost = RunningJobRunFactory(claimed_by=stale, attempts=1, max_attempts=1, parent=parent)
    JobRun.objects.filter(pk=parent.pk).update(awaiting=[lost.pk])
    grandchild = JobRunFactory(parent=lost, root=parent)
    assert transitions.rescue_stale(None, stale_after=60) == (0, 1)
    assert JobRun.objects.get(pk=lost.pk).status == Status.FAILED
    assert JobRun.objects.get(pk=grandchild.pk).status == Status.CANCELED
    assert JobRun.objects.get(pk=parent.pk).status == Status.PENDING


def test_a_worker_holding_running_runs_cannot_be_deleted_so_they_are_not_rescued() -> None:
    from django.db.models import ProtectedError

    run = RunningJobRunFactory()
    worker = run.claimed_by
    with pytest.raises(ProtectedError) as refused:
        worker.delete()
    assert {obj.pk for obj in refused.value.protected_objects} == {run.pk}
    with pytest.raises(ProtectedError):
        Worker.objects.filter(pk=worker.pk).delete()
    # The live worker's run stays where it is: nothing to rescue.
    assert transitions.rescue_stale(None, stale_after=60) == (0, 0)
    run.refresh_from_db()
    assert (run.status, run.claimed_by_id) == (Status.RUNNING, worker.pk)


def test_a_worker_whose_runs_have_ended_can_be_deleted_and_they_forget_it() -> None:
    worker = WorkerFactory()
    done = JobRunFactory(status=Status.COMPLETED, claimed_by=worker)
    worker.delete()
    done.refresh_from_db()
    assert done.claimed_by_id is None


@pytest.mark.parametrize("how", ["claim_batch", "claim_two_statements"])
def test_a_claim_says_which_runs_have_recorded_steps(how: str) -> None:
    fresh, replayed = JobRunFactory(), JobRunFactory()
    JobStep.objects.create(run=replayed, step_id="s", seq=1, status="completed", output=1)
    worker = WorkerFactory()
    if how == "claim_batch":
        claims = claiming.claim_batch(worker.pk, None, 10)
    else:
        claims = claiming.claim_two_statements(worker.pk, claiming.candidates(None), 10)
    assert {c.run_id: c.has_steps for c in claims} == {fresh.pk: False, replayed.pk: True}


def test_a_claim_whose_commit_was_not_reported_is_read_back_by_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The connection breaks after the server committed the claim, before it said so:
    # the runs must not stay running under this (live) worker for good.
    runs = start_many("tests.noop", [{}] * 3)
    worker = WorkerFactory()
    real = claiming._claim

    def committed_then_lost(*args: Any, **kwargs: Any) -> list[Claim]:
        real(*args, **kwargs)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(claiming, "_claim", committed_then_lost)
    with pytest.raises(OperationalError):
        claiming.claim_batch(worker.pk, ["default"], 2)
    monkeypatch.setattr(claiming, "_claim", real)
    claims = claiming.claim_batch(worker.pk, ["default"], 2)
    # The two claimed before, read back with their lease, then a fresh claim's one.
    assert sorted(c.run_id for c in claims) == sorted(r.pk for r in runs)
    for claim in claims:
        assert leases.fenced(claim).exists()
    assert {c.attempt for c in claims} == {1}
    assert claiming.claim_batch(worker.pk, ["default"], 2) == []


def test_a_claim_that_never_committed_leaves_nothing_to_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_many("tests.noop", [{}] * 2)
    worker = WorkerFactory()

    def lost(*args: Any, **kwargs: Any) -> list[Claim]:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(claiming, "_claim", lost)
    with pytest.raises(OperationalError):
        claiming.claim_batch(worker.pk, ["default"], 2)
    monkeypatch.undo()
    assert len(claiming.claim_batch(worker.pk, ["default"], 5)) == 2
    assert claiming._uncertain == []
