"""The watchdog's writes against the others', in the orders that deadlocked on MariaDB.

Three workers under a mixed load on MariaDB 10.11 deadlocked a few times a minute
(issue 32, finding 12). InnoDB locks every index entry a locking statement
reads, and where few runs are unfinished MariaDB reads them through a status
index (or builds a rowid filter from one): a statement then locked entries of
runs it does not change, in run_at order, and met a transaction locking by
primary key. Each test below holds one transaction open at the point where
the other's statement came in under load, with two real connections, and
then lets it go on: both must commit. The tables hold a finished history, as
a queue's do, and their statistics are refreshed, so that the planner sees
what it saw under load.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from django_jobs import cancel, transitions
from django_jobs.models import JobRun, Status, Worker, WorkerStatus
from django_jobs.storage import claiming, holds, workers
from django_jobs.storage.claiming import Claim
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory
from tests.helpers import in_thread, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HISTORY = 300  # finished runs: a status index then looks selective for the unfinished


def _history(runs: int = HISTORY) -> None:
    JobRun.objects.bulk_create(
        JobRun(job_type="tests.noop", input={}, status=Status.COMPLETED) for _ in range(runs)
    )


def _analyze(*models: type[Any]) -> None:
    """Refresh the planner's statistics, as they would be after a while under load."""
    if connection.vendor != "mysql":
        return
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f"ANALYZE TABLE {model._meta.db_table}")
            cursor.fetchall()


def _lock_waits() -> int:
    """How many transactions on the test database wait for a row lock.

    InnoDB refreshes ``innodb_trx`` only when it was not read for 0.1 s: poll slower."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.innodb_trx t "
                "JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id "
                "WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        return int(cursor.fetchone()[0])


def _blocked_or_done(thread: threading.Thread) -> Callable[[], bool]:
    """Whether ``thread`` waits for a lock, or has finished without waiting."""
    return lambda: not thread.is_alive() or _lock_waits() >= 1


def _no_errors(*results: dict[str, Any]) -> None:
    errors = [result["error"] for result in results if "error" in result]
    assert not errors, errors


def test_a_parent_ending_while_a_worker_claims_its_child_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog ends a parent past its timeout (its children are closed) while
    another worker is claiming one of them: the claim has locked the child's row
    and is about to mark it running."""
    _history()
    worker = WorkerFactory()
    parent = RunningJobRunFactory(job_type="tests.parent")
    child = JobRunFactory(parent=parent, root=parent)
    _analyze(JobRun)

    locked, go_on = threading.Event(), threading.Event()
    real_within_limits = holds.within_limits

    def between_lock_and_update(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        locked.set()
        go_on.wait(10)
        return real_within_limits(rows)

    monkeypatch.setattr(holds, "within_limits", between_lock_and_update)
    picked = claiming.candidates(["default"], locked=False)
    claimer, claimed = in_thread(lambda: claiming.claim_two_statements(worker.pk, picked, 1))
    assert locked.wait(10)
    parent_claim = Claim(
        run_id=parent.pk, attempt=1, lease_token=parent.lease_token, job_type=parent.job_type
    )
    timeout = {"type": "django_jobs.exceptions.JobTimeout", "message": "late", "attempt": 1}
    ender, ended = in_thread(
        lambda: transitions.finish(parent_claim, Status.TIMED_OUT, error=timeout)
    )
    wait_until(_blocked_or_done(ender), timeout=10, interval=0.2)  # it waits for the child's row
    go_on.set()
    claimer.join(30)
    ender.join(30)

    _no_errors(claimed, ended)
    assert [claim.run_id for claim in claimed["value"]] == [child.pk]
    assert ended["value"] is True
    parent.refresh_from_db()
    child.refresh_from_db()
    assert parent.status == Status.TIMED_OUT
    # Claimed first, then closed with its parent: a terminated child, its lease dropped.
    assert child.status == Status.CANCELED
    assert child.lease_token is None


def test_marking_silent_workers_lost_while_one_beats_again_does_not_deadlock() -> None:
    """The watchdog's sweep marks silent workers lost while one of them, only late,
    writes its heartbeat. That UPDATE locks the worker's row, then its entry in
    the (status, heartbeat_at) index; a statement cannot be paused in between, so
    the heartbeat's transaction takes the row first and then beats."""
    WorkerFactory.create_batch(30, status=WorkerStatus.STOPPED)  # a history of workers
    gone, late = WorkerFactory(), WorkerFactory()
    Worker.objects.filter(pk=gone.pk).update(heartbeat_at=Now() - timedelta(seconds=120))
    Worker.objects.filter(pk=late.pk).update(heartbeat_at=Now() - timedelta(seconds=90))
    _analyze(Worker)

    holding, beat = threading.Event(), threading.Event()

    def heartbeat() -> bool:
        with transaction.atomic():
            list(Worker.objects.select_for_update().filter(pk=late.pk).values_list("pk"))
            holding.set()
            beat.wait(10)
            return workers.heartbeat(late.pk, WorkerStatus.RUNNING)

    beater, beaten = in_thread(heartbeat)
    assert holding.wait(10)
    sweeper, swept = in_thread(lambda: workers.mark_lost(60))
    wait_until(_blocked_or_done(sweeper), timeout=10, interval=0.2)
    beat.set()
    beater.join(30)
    sweeper.join(30)

    _no_errors(beaten, swept)
    assert beaten["value"] is True
    assert swept["value"] == 1
    statuses = dict(Worker.objects.filter(pk__in=[gone.pk, late.pk]).values_list("pk", "status"))
    assert statuses == {gone.pk: WorkerStatus.LOST, late.pk: WorkerStatus.RUNNING}


def test_waking_sleepers_while_a_transaction_cancels_them_does_not_deadlock() -> None:
    """The watchdog wakes two sleepers while a transaction that locked the first (as
    a cancel does before it writes) goes on to cancel the second. The sleepers'
    run_at order is the reverse of their id order."""
    _history()
    first = JobRunFactory(status=Status.WAITING)
    second = JobRunFactory(status=Status.WAITING)
    JobRun.objects.filter(pk=first.pk).update(run_at=Now() - timedelta(seconds=1))
    JobRun.objects.filter(pk=second.pk).update(run_at=Now() - timedelta(seconds=2))
    _analyze(JobRun)

    locked_first, go_on = threading.Event(), threading.Event()

    def cancel_both() -> int:
        with transaction.atomic():
            list(JobRun.objects.select_for_update().filter(pk=first.pk).values_list("pk"))
            locked_first.set()
            go_on.wait(10)
            return cancel(second.pk) + cancel(first.pk)

    canceler, canceled = in_thread(cancel_both)
    assert locked_first.wait(10)
    waker, woken = in_thread(transitions.wake_sleepers)
    wait_until(_blocked_or_done(waker), timeout=10, interval=0.2)
    go_on.set()
    canceler.join(30)
    waker.join(30)

    _no_errors(canceled, woken)
    assert canceled["value"] == 2
    # Both end canceled; the second may have been woken (to pending) before its cancel.
    statuses = set(JobRun.objects.filter(pk__in=[first.pk, second.pk]).values_list("status"))
    assert statuses == {(Status.CANCELED,)}


def test_the_claims_writes_lock_runs_by_primary_key_alone() -> None:
    """The two-statement claim (MariaDB, MySQL, SQLite; and a key conflict's retry
    on PostgreSQL) locks the rows it picked, and marks them running, by id alone.

    With ``status = 'pending'`` in those statements InnoDB read them through the
    waiting index where few runs were pending, locking entries of runs a
    rate-limited claim then needed while it held a limit's row that this claim
    waited for: one deadlock in the stress runs.
    """
    _history()
    worker = WorkerFactory()
    runs = [JobRunFactory() for _ in range(3)]
    _analyze(JobRun)
    picked = JobRun.objects.filter(status=Status.PENDING).order_by("pk")
    with CaptureQueriesContext(connection) as queries:
        claims = claiming.claim_two_statements(worker.pk, picked, 10)
    assert sorted(c.run_id for c in claims) == [r.pk for r in runs]
    table = JobRun._meta.db_table
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if table in q["sql"] and ("FOR UPDATE" in q["sql"] or q["sql"].startswith("UPDATE"))
    ]
    assert len(writes) == 2, writes
    by_id_alone = re.compile(
        r"""WHERE [`"]?\w+[`"]?\.[`"]?id[`"]? IN \([\d, ]+\)(\s+FOR UPDATE.*)?$"""
    )
    for sql in writes:
        assert by_id_alone.search(sql), sql
