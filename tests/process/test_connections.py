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


def session_id() -> int:
    """This thread's session on the test database (MySQL and MariaDB)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def sessions(name: str, ours: int | None) -> int:
    """The worker's sessions: those named ``name`` (PostgreSQL), or every session of
    the test database but this test's two, ``ours`` and the one asking (MySQL and
    MariaDB name no session)."""
    with connections["default"].cursor() as cursor:
        if connections["default"].vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID() AND id <> %s",
                [ours],
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]
            )
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
    ours = session_id() if connections["default"].vendor == "mysql" else None

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sessions(name, ours))
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
