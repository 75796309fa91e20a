"""A worker's threads outlive a connection left inside an atomic block by a failure
half-way: the next call on the thread connects afresh instead of failing for good."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_jobs import JobContext, RetryPolicy, job, start
from django_jobs.eventloop import DatabaseThreads
from django_jobs.models import JobRun, Status
from django_jobs.storage.connections import end_leaked_transactions
from django_jobs.worker import JobWorker
from tests.helpers import status_of, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def leave_a_block_open() -> None:
    """What a failure half-way can leave: a block entered, never exited, and the
    connection closed inside it."""
    transaction.atomic().__enter__()
    connection.close()
    raise ConnectionError("the connection was lost")


@job("leaks.open_block", pool="leaks", retry=RetryPolicy(attempts=1))
def open_block(ctx: JobContext) -> None:
    leave_a_block_open()


@job("leaks.open_and_return", pool="leaks")
def open_and_return(ctx: JobContext) -> int:
    transaction.atomic().__enter__()
    return count_runs()


@job("leaks.count", pool="leaks")
def count(ctx: JobContext) -> int:
    return count_runs()


def count_runs() -> int:
    return JobRun.objects.count()


def test_a_database_thread_left_inside_a_block_answers_the_next_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    threads = DatabaseThreads(1)

    async def calls() -> Any:
        with pytest.raises(ConnectionError):
            await threads.run(leave_a_block_open)
        return await threads.run(count_runs)

    try:
        with caplog.at_level(logging.WARNING, logger="django_jobs.storage.connections"):
            assert asyncio.run(calls()) == 0
    finally:
        threads.close()
    assert "left inside a transaction" in caplog.text


def test_a_sound_connection_is_left_alone() -> None:
    """Outside any block, nothing is closed (a slot keeps its connection across runs)."""
    results: list[Any] = []

    def work() -> None:
        try:
            count_runs()
            kept = connection.connection
            end_leaked_transactions()
            results.append(connection.connection is kept and kept is not None)
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results == [True]


def test_a_worker_slot_left_inside_a_block_runs_the_next_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One slot: the run after the one that left a block open runs on the same thread,
    and its handler's query connects afresh."""
    broken = start("leaks.open_block", pool="leaks")
    after = start("leaks.count", pool="leaks")
    worker = JobWorker(["leaks"], concurrency=1, poll_interval=0.05, burst=True)
    with caplog.at_level(logging.WARNING, logger="django_jobs.storage.connections"):
        thread = threading.Thread(target=worker.run)
        thread.start()
        thread.join(60)
    assert not thread.is_alive()
    wait_until(lambda: status_of(after) in (Status.COMPLETED, Status.FAILED))
    assert status_of(broken) == Status.FAILED
    assert status_of(after) == Status.COMPLETED
    assert JobRun.objects.get(pk=after.pk).output == 2
    assert "left inside a transaction" in caplog.text


def test_a_handler_that_never_leaves_its_block_gets_its_outcome_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The block is undone (nothing in it was committed) and the outcome written on a
    fresh connection; the next run on the slot runs."""
    left_open = start("leaks.open_and_return", pool="leaks")
    after = start("leaks.count", pool="leaks")
    worker = JobWorker(["leaks"], concurrency=1, poll_interval=0.05, burst=True)
    with caplog.at_level(logging.WARNING, logger="django_jobs.storage.connections"):
        thread = threading.Thread(target=worker.run)
        thread.start()
        thread.join(60)
    assert not thread.is_alive()
    assert (status_of(left_open), status_of(after)) == (Status.COMPLETED, Status.COMPLETED)
    assert JobRun.objects.get(pk=left_open.pk).output == 2
    assert "left inside a transaction" in caplog.text
