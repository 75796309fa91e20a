"""How many connections one worker holds: its concurrency plus two, at peak (issue 17).

One connection per slot (a handler's queries and steps), one shared by the
control threads (claims, heartbeats, the watchdog, completions, schedules), and
one that LISTENs. The worker's sessions are told apart in ``pg_stat_activity``
by their ``application_name``; the count is sampled while every kind of work
goes on at once.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from django.db import connections

from django_jobs import cancel, start, start_many
from django_jobs.management.arguments import DEFAULT_CONCURRENCY
from django_jobs.models import JobRun, Status, Worker
from tests.helpers import WorkerProcess, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def session_ids() -> set[int]:
    """The sessions open on the test database now (MySQL and MariaDB)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT id FROM information_schema.processlist WHERE db = DATABASE()")
        return {int(row[0]) for row in cursor.fetchall()}


def sessions(name: str, before: set[int]) -> int:
    """The worker's sessions: those named ``name`` (PostgreSQL), or the sessions of
    the test database opened since ``before`` but the one asking (MySQL and
    MariaDB name no session)."""
    with connections["default"].cursor() as cursor:
        if connections["default"].vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            return len({int(row[0]) for row in cursor.fetchall()} - before)
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("concurrency", [1, 4, None])  # None: no --concurrency flag
def test_a_worker_holds_its_concurrency_plus_two_connections(
    start_worker: StartWorker, concurrency: int | None
) -> None:
    flags = [] if concurrency is None else ["--concurrency", str(concurrency)]
    slots = concurrency or DEFAULT_CONCURRENCY
    name = f"djjobs-{uuid.uuid4().hex[:12]}"
    # Every kind of work at once: slots busy, steps, children and their
    # wake-ups, durable sleeps, retries, timeouts, a cancel, and a schedule.
    start_many("tests.sleep", [{"seconds": 0.3}] * 20)
    start_many("tests.three_steps", [{}] * 10)
    start_many("tests.parent", [{"n": 3}] * 5)
    start_many("tests.sleeper", [{"seconds": 0.2}] * 5)
    start_many("tests.flaky", [{}] * 5)
    start_many("tests.slow", [{}] * 3)
    doomed = start("tests.sleep", {"seconds": 5})
    before = session_ids() if connections["default"].vendor == "mysql" else set()
    worker = start_worker(
        "--pool",
        "default",
        "--pool",
        "echo",  # the children's
        *flags,
        DJANGO_SETTINGS_MODULE="tests.process.schedule_settings",
        DJANGO_JOBS_APPLICATION_NAME=name,
        DJANGO_JOBS_CANCEL_GRACE="1",
    )
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sessions(name, before))
            done.wait(0.01)
        connections.close_all()

    sampler = threading.Thread(target=sample)
    sampler.start()
    unfinished = JobRun.objects.filter(
        status__in=[Status.PENDING, Status.RUNNING, Status.WAITING]
    ).exclude(job_type="tests.record")  # the schedule's runs come every minute
    try:
        try:
            wait_until(
                lambda: JobRun.objects.filter(pk=doomed.pk, status=Status.RUNNING).exists(), 60
            )
        except BaseException:
            pytest.fail(f"the run to cancel never ran\n{worker.output()[-4000:]}")
        cancel(doomed.pk)
        try:
            wait_until(lambda: not unfinished.exists(), timeout=120)
        except BaseException:
            rows = list(unfinished.values_list("pk", "job_type", "status", "attempts"))
            pytest.fail(f"unfinished: {rows}\n{worker.output()[-4000:]}")
    finally:
        done.set()
        sampler.join()
    assert worker.proc.poll() is None, worker.output()
    assert Worker.objects.get(pid=worker.pid).concurrency == slots
    assert slots + 1 <= peak <= slots + 2, (peak, worker.output()[-3000:])
