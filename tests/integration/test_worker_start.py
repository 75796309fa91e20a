"""A worker that cannot start says why in one line and leaves no Worker row "running"."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_jobs import worker as worker_module
from django_jobs.checks import connection_limit
from django_jobs.models import Worker, WorkerStatus
from django_jobs.worker import JobWorker

pytestmark = pytest.mark.django_db


@pytest.fixture
def threads_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The third thread a worker starts fails as when the process has no threads left."""
    started = 0
    real_start = worker_module.start_thread

    def start(target: Any, name: str) -> threading.Thread:
        nonlocal started
        started += 1
        if started == 3:
            raise RuntimeError("can't start new thread")
        return real_start(target, name)

    monkeypatch.setattr(worker_module, "start_thread", start)


@pytest.mark.usefixtures("threads_run_out")
def test_a_failed_start_marks_the_worker_row_stopped() -> None:
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="can't start new thread"):
        JobWorker(["default"], concurrency=8, poll_interval=0.05).run()
    worker = Worker.objects.get()
    assert worker.status == WorkerStatus.STOPPED
    assert worker.stopped_at is not None
    # The two slot threads that did start were told to stop.
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
        assert not thread.is_alive(), thread.name


@pytest.mark.usefixtures("threads_run_out")
def test_the_command_says_to_lower_the_concurrency() -> None:
    with pytest.raises(CommandError, match=r"could not start its threads .* lower --concurrency"):
        call_command("runjobworker", "--concurrency", "8", "--burst")
    assert Worker.objects.get().status == WorkerStatus.STOPPED


def test_a_concurrency_above_the_servers_connections_is_refused() -> None:
    limit = connection_limit(connection.alias)
    assert limit is not None
    if limit >= 1000:
        pytest.skip(f"max_connections is {limit}: --concurrency cannot exceed it")
    with pytest.raises(CommandError, match=rf"its server accepts {limit} \(max_connections\)"):
        call_command("runjobworker", "--concurrency", str(limit + 1), "--burst")
    assert not Worker.objects.exists()
