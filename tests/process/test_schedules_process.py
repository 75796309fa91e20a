"""Real runjobworker processes scheduling: one run per tick, with schedules declared in
settings and with schedules added, changed, paused, resumed and deleted under them.

Ticks are minutes. To have ticks due without waiting for them, a test stores a
schedule's latest handled tick some minutes back, as if every worker had been
down since (or the schedule paused): the missed ticks are then due at once.
Only the last test waits for one minute to turn.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Count, QuerySet

from django_jobs import (
    add_schedule,
    change_schedule,
    delete_schedule,
    pause_schedule,
    resume_schedule,
    start,
)
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
    # And none ran more than once, each completed one once (a tick started just
    # before the workers were stopped may not have run).
    ids = list(scheduled_runs().values_list("id", flat=True))
    counts = Execution.objects.filter(run_id__in=ids).values("run_id").annotate(n=Count("id"))
    assert {row["n"] for row in counts} <= {1}
    completed = set(scheduled_runs().filter(status=Status.COMPLETED).values_list("id", flat=True))
    assert completed <= {row["run_id"] for row in counts}
    assert len(completed) >= len(expected) - 1


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


# --- run-time schedules ----------------------------------------------------------------


def minute() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


def runs_of(name: str) -> QuerySet[JobRun]:
    return JobRun.objects.filter(idempotency_key__startswith=f"schedule:{name}:")


def add_handled_until(name: str, job_type: str, last_tick: datetime, **options: Any) -> None:
    """Add a schedule as if it had been handled up to ``last_tick`` (its missed ticks
    since are due at once); workers see it only once both are committed."""
    with transaction.atomic():
        add_schedule(name, job_type, "* * * * *", timezone="UTC", **options)
        JobSchedule.objects.filter(name=name).update(
            created_at=last_tick - timedelta(days=1), last_tick=last_tick
        )


def seen_by_all(workers: list[WorkerProcess], text: str) -> None:
    """Wait until every worker has logged ``text`` (its scheduler applied a change)."""
    wait_until(lambda: all(text in worker.output() for worker in workers), timeout=60)


def assert_one_run_per_tick(name: str, after: datetime | None = None) -> list[datetime]:
    """Each tick of ``name`` has one run, and each finished run ran once; with
    ``after``, every minute from it to the latest tick has its run. Return the ticks."""
    wait_until(lambda: runs_of(name).filter(status=Status.COMPLETED).exists(), timeout=60)
    found = sorted(runs_of(name).values_list("run_at", flat=True))
    assert len(found) == len(set(found)), found
    done = runs_of(name).filter(status=Status.COMPLETED, job_type="tests.record")
    executions = Execution.objects.filter(run_id__in=list(done.values_list("id", flat=True)))
    per_run = executions.values("run_id").annotate(n=Count("id")).values_list("n", flat=True)
    assert set(per_run) <= {1}
    if after is not None:
        assert found == every_minute(after, found[-1])
    return found


def every_minute(after: datetime, until: datetime) -> list[datetime]:
    return [after + timedelta(minutes=n) for n in range(1, int((until - after) / MINUTE) + 1)]


MINUTE = timedelta(minutes=1)


def test_workers_follow_schedules_changed_under_them(start_worker: StartWorker) -> None:
    # The test settings declare no schedule: every worker's scheduler runs anyway.
    workers = [start_worker("--pool", "default", "--concurrency", "2") for _ in range(3)]
    seen_by_all(workers, "scheduler started schedules=")

    # Added under running workers, 4 minutes behind, catching up: each minute once.
    added = minute() - 4 * MINUTE
    add_handled_until("rt.added", "tests.record", added, missed="catch_up", input={"v": 1})
    wait_until(lambda: runs_of("rt.added").count() >= 4, timeout=60)
    assert_one_run_per_tick("rt.added", after=added)
    assert all(run.input == {"v": 1} for run in runs_of("rt.added"))

    # Added paused; its target and input changed while paused; resumed: the missed
    # minutes run, each once, under the changed definition.
    edited = minute() - 3 * MINUTE
    add_handled_until("rt.edited", "tests.noop", edited, missed="catch_up", paused=True)
    seen_by_all(workers, "schedule=rt.edited revision=1 paused")
    change_schedule("rt.edited", job_type="tests.record", input={"v": 2})
    seen_by_all(workers, "schedule=rt.edited revision=2 paused target=tests.record")
    assert not runs_of("rt.edited").exists()
    resume_schedule("rt.edited")
    wait_until(lambda: runs_of("rt.edited").count() >= 3, timeout=60)
    assert_one_run_per_tick("rt.edited", after=edited)
    assert set(runs_of("rt.edited").values_list("job_type", flat=True)) == {"tests.record"}
    assert all(run.input == {"v": 2} for run in runs_of("rt.edited"))

    # Paused 4 minutes, resumed under skip: only the tick still on time runs.
    last = minute() - 4 * MINUTE
    add_handled_until("rt.skip", "tests.record", last, missed="skip", paused=True)
    seen_by_all(workers, "schedule=rt.skip revision=1 paused")
    resumed = datetime.now(UTC)
    resume_schedule("rt.skip")
    wait_until(lambda: runs_of("rt.skip").exists(), timeout=60)
    skip_ticks = assert_one_run_per_tick("rt.skip")
    # A tick runs only if it was at most 60 s old when a worker took it, after the resume.
    assert all(tick >= resumed - timedelta(seconds=60) for tick in skip_ticks)
    assert skip_ticks[0] > last + MINUTE  # the first missed minutes were skipped

    # One minute turns with a schedule running, one paused and one deleted under
    # the workers: the running one gets its tick once, the others nothing.
    add_schedule("rt.every", "tests.record", "* * * * *", timezone="UTC")
    add_schedule("rt.paused", "tests.record", "* * * * *", timezone="UTC", missed="catch_up")
    add_schedule("rt.deleted", "tests.record", "* * * * *", timezone="UTC")
    seen_by_all(workers, "schedule=rt.deleted revision=1 active")
    pause_schedule("rt.paused")
    paused = datetime.now(UTC)  # after the pause committed: a tick before it may fire
    delete_schedule("rt.deleted")
    deleted = datetime.now(UTC)
    seen_by_all(workers, "schedule=rt.paused revision=2 paused")
    seen_by_all(workers, "schedule=rt.deleted deleted")
    changed = datetime.now(UTC)
    wait_until(lambda: runs_of("rt.every").filter(run_at__gt=changed).exists(), timeout=120)
    assert not runs_of("rt.paused").filter(run_at__gt=paused).exists()
    assert not runs_of("rt.deleted").filter(run_at__gt=deleted).exists()
    assert_one_run_per_tick("rt.every")

    # Resumed under catch_up: every minute since it was added runs, once.
    row = JobSchedule.objects.get(name="rt.paused")
    first = row.created_at.replace(second=0, microsecond=0)
    resume_schedule("rt.paused")
    # Finished, not only started: the workers are stopped next, and a stopped worker
    # claims nothing more.
    wait_until(
        lambda: runs_of("rt.paused").filter(run_at__gt=changed, status=Status.COMPLETED).exists(),
        timeout=60,
    )
    assert_one_run_per_tick("rt.paused", after=first)

    stop(workers)
    for worker in workers:
        assert "Traceback" not in worker.output(), worker.output()[-3000:]
    # With every worker stopped, the counts again, to the last tick handled.
    for name, after in [("rt.added", added), ("rt.edited", edited), ("rt.paused", first)]:
        assert_one_run_per_tick(name, after)
    assert_one_run_per_tick("rt.every")


def test_a_schedule_deleted_and_added_again_under_running_workers_is_a_new_one(
    start_worker: StartWorker,
) -> None:
    """Added again under its name, a schedule is at revision 1 again, as the one the
    workers last read was: they must still see a new schedule, not keep the old
    one's state (paused; waiting for a daily tick)."""
    workers = [start_worker("--pool", "default", "--concurrency", "2") for _ in range(3)]
    seen_by_all(workers, "scheduler started schedules=")
    add_schedule("rt.again-paused", "tests.record", "* * * * *", timezone="UTC", paused=True)
    add_schedule(
        "rt.again-input", "tests.record", "* * * * *", timezone="UTC", paused=True, input={"v": 1}
    )
    add_schedule("rt.again-daily", "tests.record", "0 0 * * *", timezone="UTC")
    seen_by_all(workers, "schedule=rt.again-paused revision=1 paused")
    seen_by_all(workers, "schedule=rt.again-input revision=1 paused")
    seen_by_all(workers, "schedule=rt.again-daily revision=1 active")

    # In one transaction: no reread of the workers can fall between the two.
    last = minute() - 2 * MINUTE
    names = ["rt.again-paused", "rt.again-input", "rt.again-daily"]
    with transaction.atomic():
        for name in names:
            delete_schedule(name)
        add_handled_until("rt.again-paused", "tests.record", last, missed="catch_up")
        add_handled_until("rt.again-input", "tests.record", last, missed="catch_up", input={"v": 2})
        add_handled_until("rt.again-daily", "tests.record", last, missed="catch_up")
    assert set(JobSchedule.objects.values_list("revision", flat=True)) == {1}
    for name in names:
        # Finished, not only started: the workers are stopped next, and a stopped
        # worker claims nothing more.
        wait_until(
            lambda name=name: runs_of(name).filter(status=Status.COMPLETED).count() >= 2,
            timeout=60,
        )

    stop(workers)
    for worker in workers:
        assert "Traceback" not in worker.output(), worker.output()[-3000:]
    for name in names:
        assert_one_run_per_tick(name, after=last)
    assert all(run.input == {"v": 2} for run in runs_of("rt.again-input"))
