"""Callers that wait for runs (JobRun.wait, await_result) while a real worker runs them:
over NOTIFY on PostgreSQL, by polling elsewhere."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.db import connection

from django_jobs import cancel, start
from django_jobs.exceptions import RunCanceled, RunFailed, WaitTimeout
from django_jobs.models import JobRun, Status
from tests.process.faults import StartWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


def test_wait_returns_the_output_or_raises_the_runs_error(start_worker: StartWorker) -> None:
    worker = start_worker("--pool", "default")
    run = start("tests.record")
    assert run.wait(timeout=30) == {"attempt": 1}
    assert run.status == Status.COMPLETED
    failing = start("tests.fails_with", {"message": "nope"})
    with pytest.raises(RunFailed) as failed:
        failing.wait(timeout=30)
    assert failed.value.run_id == failing.pk
    assert failed.value.error["type"] == "builtins.ValueError"
    assert str(failed.value) == f"run {failing.pk} ended failed: nope"
    assert worker.proc.poll() is None


def test_await_result_in_async_code(start_worker: StartWorker) -> None:
    start_worker("--pool", "default")
    runs = [start("tests.record") for _ in range(5)]

    async def all_of_them() -> list[object]:
        return list(await asyncio.gather(*(run.await_result(timeout=30) for run in runs)))

    assert asyncio.run(all_of_them()) == [{"attempt": 1}] * 5


def test_a_timeout_raises_and_leaves_the_run_as_it_is() -> None:
    run = start("tests.noop")  # no worker: it stays pending
    began = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"has not finished after 0\.3s"):
        run.wait(timeout=0.3)
    assert time.monotonic() - began >= 0.3
    assert JobRun.objects.get(pk=run.pk).status == Status.PENDING


def test_a_cancel_while_waiting_raises_run_canceled() -> None:
    run = start("tests.noop")

    def cancel_soon() -> None:
        time.sleep(0.3)
        cancel(run.pk, reason="operator")
        connection.close()

    thread = threading.Thread(target=cancel_soon)
    thread.start()
    with pytest.raises(RunCanceled, match="canceled: operator"):
        run.wait(timeout=30)
    thread.join()
