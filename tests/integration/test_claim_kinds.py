"""A run's kind (``JobRun.is_async``) and the claim by kind: a worker's event loop and
its threads each claim from their own part of the claim's index, so a deep backlog of
one kind (an event loop at its limit) costs the other kind's claims nothing."""

from __future__ import annotations

import pytest
from django.db import connection

from django_jobs import start, start_many
from django_jobs.models import JobRun, Status
from django_jobs.storage import claiming
from django_jobs.tasks_backend import run_id
from django_jobs.testing import drain
from django_jobs.worker import EXIT_OK, JobWorker
from tests.factories import WorkerFactory
from tests.integration.test_claim_statistics import _explained, _handler_reads, record_statements
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 20_000
BATCH = 16
BUDGET = 1_000  # rows a claim of 16 may read (see test_claim_statistics)


def kinds(runs: list[JobRun]) -> list[bool]:
    found = dict(JobRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("id", "is_async"))
    return [found[run.pk] for run in runs]


def test_a_run_is_of_its_handlers_kind_from_its_start() -> None:
    runs = [
        start("tests.noop"),
        start("tests.async_echo"),
        *start_many("tests.async_echo", [{}, {}]),
        *start_many("tests.noop", [{}]),
    ]
    assert kinds(runs) == [False, True, True, True, False]


def test_a_task_is_of_its_functions_kind() -> None:
    sync = JobRun.objects.get(pk=run_id(tasks.add.enqueue(1, 2).id))
    coroutine = JobRun.objects.get(pk=run_id(tasks.add_async.enqueue(1, 2).id))
    assert (sync.is_async, coroutine.is_async) == (False, True)


def test_a_claim_of_one_kind_takes_none_of_the_others() -> None:
    async_runs = start_many("tests.async_echo", [{}] * 3)
    sync_runs = start_many("tests.noop", [{}] * 3)
    worker = WorkerFactory().pk
    assert {c.run_id for c in claiming.claim_batch(worker, ["default"], 10, kind=False)} == {
        r.pk for r in sync_runs
    }
    assert {c.run_id for c in claiming.claim_batch(worker, ["default"], 10, kind=True)} == {
        r.pk for r in async_runs
    }


def test_a_claim_of_both_kinds_takes_them_in_claim_order() -> None:
    first = start("tests.async_echo")
    second = start("tests.noop")
    urgent = start("tests.async_echo", priority=5)
    claims = claiming.claim_batch(WorkerFactory().pk, ["default"], 2)
    assert [c.run_id for c in claims] == [urgent.pk, first.pk]
    assert [c.run_id for c in claiming.claim_batch(WorkerFactory().pk, None, 2)] == [second.pk]


def _backlog_then(kind: bool) -> None:
    """BACKLOG due runs of the other kind first, then BATCH of ``kind``, statistics fresh."""
    start_many("tests.noop" if kind else "tests.async_echo", [{}] * BACKLOG)
    start_many("tests.async_echo" if kind else "tests.noop", [{}] * BATCH)
    with connection.cursor() as cursor:
        table = JobRun._meta.db_table
        cursor.execute(f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}{table}")


@pytest.mark.parametrize("kind", [False, True], ids=["threads", "event loop"])
def test_a_claim_reads_past_none_of_the_other_kinds_backlog(
    monkeypatch: pytest.MonkeyPatch, kind: bool
) -> None:
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("rows read are counted on PostgreSQL (EXPLAIN ANALYZE) and MySQL")
    _backlog_then(kind)
    worker = WorkerFactory().pk
    if connection.vendor == "mysql":
        before = _handler_reads()
        claims = claiming.claim_batch(worker, ["default"], BATCH, kind=kind)
        assert _handler_reads() - before < BUDGET
    else:
        seen = record_statements(monkeypatch)
        claims = claiming.claim_batch(worker, ["default"], BATCH, kind=kind)
        (claim,) = [(sql, params) for sql, params in seen if "django_jobs claim" in sql]
        # Explained after the fact: the 16 are running, the plan reads the same.
        assert _explained(*claim) < BUDGET
    assert len(claims) == BATCH
    assert {c.job_type for c in claims} == {"tests.async_echo" if kind else "tests.noop"}


def test_an_async_run_started_as_a_sync_one_still_runs_on_the_event_loop() -> None:
    # Started by a process that did not know its handler is async (or before 0015).
    runs = start_many("tests.async_echo", [{"i": i} for i in range(3)])
    JobRun.objects.filter(pk__in=[r.pk for r in runs]).update(is_async=False)
    worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
    assert worker.run() == EXIT_OK
    assert worker._event_loop is not None
    assert set(JobRun.objects.values_list("status", flat=True)) == {Status.COMPLETED}


def test_a_sync_run_marked_async_runs_on_a_thread() -> None:
    # The other way round (a handler made sync since the run started): the loop's
    # claim takes it, a thread runs it.
    run = start("tests.noop")
    JobRun.objects.filter(pk=run.pk).update(is_async=True)
    worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
    assert worker.run() == EXIT_OK
    assert worker._event_loop is None
    assert JobRun.objects.get(pk=run.pk).status == Status.COMPLETED


def test_drain_runs_both_kinds() -> None:
    start_many("tests.async_echo", [{}] * 2)
    start_many("tests.noop", [{}] * 2)
    assert drain() == 4


def test_a_claim_for_no_pool_takes_nothing_of_either_kind() -> None:
    start("tests.noop")
    start("tests.async_echo")
    worker = WorkerFactory().pk
    assert claiming.claim_batch(worker, [], 5) == []
    assert len(claiming.claim_batch(worker, ["default"], 5)) == 2
