"""Two real runjobworker processes scheduling one schedule: one run per missed tick."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Count, QuerySet

from django_jobs import start
from django_jobs.models import JobRun, JobSchedule, Status
from tests.helpers import ROOT, WorkerProcess, wait_until, worker_env
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]
SETTINGS = "tests.process.schedule_settings"
NAME = "process.every_minute"  # "* * * * *", UTC, catch_up: see schedule_settings.py


def seed(missed: int) -> datetime:
    """Store a last tick ``missed`` minutes ago, as if every worker had been down since."""
    last = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=missed)
    JobSchedule.objects.create(
        name=NAME,
        job_type="tests.record",
        cron="* * * * *",
        timezone="UTC",
        missed="catch_up",
        last_tick=last,
        created_at=last - timedelta(days=1),
    )
    return last


def scheduled_runs() -> QuerySet[JobRun]:
    return JobRun.objects.filter(trigger_source="schedule", trigger_ref=NAME)


def stop(workers: list[WorkerProcess]) -> None:
    # A worker still starting (Django's setup, the checks) has no SIGTERM handler
    # yet and would die of the signal: wait until each has started.
    wait_until(lambda: all(" started pools=" in worker.output() for worker in workers), timeout=60)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output()


def test_two_workers_start_one_run_per_missed_tick(start_worker: StartWorker) -> None:
    last = seed(missed=4)
    workers = [
        start_worker("--pool", "default", "--concurrency", "2", DJANGO_SETTINGS_MODULE=SETTINGS)
        for _ in range(2)
    ]
    wait_until(lambda: scheduled_runs().filter(status=Status.COMPLETED).count() >= 4, timeout=60)
    started = f"scheduler started schedules={NAME}"
    wait_until(lambda: all(started in worker.output() for worker in workers), timeout=60)
    stop(workers)
    handled = JobSchedule.objects.get(name=NAME).last_tick
    assert handled is not None
    # Every tick from the seeded one to the latest handled (a minute may have
    # passed meanwhile) has exactly one run, with the tick as run_at.
    minutes = int((handled - last) / timedelta(minutes=1))
    assert minutes >= 4
    expected = [last + timedelta(minutes=n) for n in range(1, minutes + 1)]
    ticks = sorted(scheduled_runs().values_list("run_at", flat=True))
    assert ticks == expected
    assert all(run.input == {"scheduled": True} for run in scheduled_runs())
    keys = set(scheduled_runs().values_list("idempotency_key", flat=True))
    assert len(keys) == len(expected)
    # And each ran once.
    ids = list(scheduled_runs().values_list("id", flat=True))
    counts = Execution.objects.filter(run_id__in=ids).values("run_id").annotate(n=Count("id"))
    assert sorted(row["n"] for row in counts) == [1] * len(expected)


def test_no_scheduler_flag_starts_no_scheduled_runs(start_worker: StartWorker) -> None:
    last = seed(missed=3)
    worker = start_worker("--pool", "default", "--no-scheduler", DJANGO_SETTINGS_MODULE=SETTINGS)
    # The worker is up and claiming: a run started by hand is done.
    probe = start("tests.record")
    wait_until(lambda: JobRun.objects.get(pk=probe.pk).status == Status.COMPLETED, timeout=30)
    stop([worker])
    assert "scheduler started" not in worker.output()
    assert scheduled_runs().count() == 0
    assert JobSchedule.objects.get(name=NAME).last_tick == last


def test_no_scheduler_takes_no_value() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobworker", "--no-scheduler=yes"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--no-scheduler: ignored explicit argument 'yes'" in result.stderr
