"""A worker's threads outlive a connection left inside an atomic block by a failure
half-way: the next call on the thread connects afresh instead of failing for good."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_jobs.eventloop import DatabaseThreads
from django_jobs.models import JobRun
from django_jobs.storage.connections import end_leaked_transactions

pytestmark = pytest.mark.django_db(transaction=True)


def leave_a_block_open() -> None:
    """What a failure half-way can leave: a block entered, never exited, and the
    connection closed inside it."""
    transaction.atomic().__enter__()
    connection.close()
    raise ConnectionError("the connection was lost")


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
