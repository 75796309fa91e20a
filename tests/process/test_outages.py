"""Database connections killed under the workers' feet, again and again.

Every connection of the test database but the test's own is terminated
(``pg_terminate_backend``, ``KILL CONNECTION``) while workers claim, run steps and complete:
workers must log, reconnect and go on, losing no run and repeating no
recorded step.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_jobs import start_many
from django_jobs.models import JobRun, JobStep, Status, Worker, WorkerStatus
from tests.helpers import terminate_other_connections, wait_until
from tests.process.faults import (
    StartWorker,
    assert_alive_and_stop_cleanly,
    assert_every_run_completed_once,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

RUNS = 150
OUTAGES = 5


def test_killed_connections_lose_no_run_and_repeat_no_recorded_step(
    start_worker: StartWorker,
) -> None:
    start_many("tests.chaos", [{"pause": 0.05} for _ in range(RUNS)])
    workers = [start_worker("--pool", "default", "--concurrency", "4") for _ in range(2)]
    # Both running (their Worker rows written) before the first outage: this is
    # about running workers. (A connection killed while a worker starts, after
    # its wait for the database, ends that start with a database error.)
    running = Worker.objects.filter(status=WorkerStatus.RUNNING)
    wait_until(lambda: running.count() == 2 and JobStep.objects.exists(), timeout=30)
    terminated = 0
    for _ in range(OUTAGES):
        terminated += terminate_other_connections()
        time.sleep(1.0)
    wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == RUNS, timeout=120)
    assert_every_run_completed_once(RUNS)
    assert_alive_and_stop_cleanly(workers)
    assert terminated > 0
    # They said so: the claim loop, the background threads and the listener.
    output = "".join(worker.output() for worker in workers)
    said = (
        ("Connection was killed", "Lost connection", "Server has gone away")
        if connection.vendor == "mysql"
        else ("terminating connection due to administrator command",)
    )
    assert any(words in output for words in said), output[-3000:]
    print(f"\noutages: {OUTAGES}, connections terminated: {terminated}, runs: {RUNS}")
