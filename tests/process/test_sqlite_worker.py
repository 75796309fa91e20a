"""``runjobworker`` on a SQLite file: four threads, every durable feature, one process.

The whole project lives on one SQLite file, as in development: the worker
subprocesses get it through ``DJANGO_JOBS_SQLITE`` (tests/settings.py), and this
process, standing for the web process, reaches the same file as the alias ``sqlite``.
"""

from __future__ import annotations

import contextlib
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.utils import load_backend
from django.test import override_settings

from django_jobs import cancel, start, start_many
from django_jobs.models import JobRun, JobSchedule, Status
from tests.helpers import WorkerProcess, wait_until
from tests.settings import sqlite_file
from tests.testapp.models import Execution

pytestmark = pytest.mark.process

StartWorker = Callable[..., WorkerProcess]
SCHEDULE = "process.every_minute"  # tests.record, every minute, catch_up: schedule_settings.py
STARTED = " started pools="


@pytest.fixture
def database(tmp_path: Path, django_db_blocker: Any) -> Iterator[Path]:
    """A migrated SQLite file: this process's jobs database, as the alias ``sqlite``."""
    path = tmp_path / "db.sqlite3"
    settings = {**connections.settings["sqlite"], **sqlite_file(str(path))}
    wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "sqlite")
    original = connections["sqlite"]
    connections["sqlite"] = wrapper
    try:
        with django_db_blocker.unblock(), override_settings(DJANGO_JOBS={"DATABASE": "sqlite"}):
            # Every app but modelsearch's (its migrations write the index of the
            # default database's vendor, MariaDB's when the suite runs there).
            for config in apps.get_app_configs():
                if config.label in {"modelsearch", "searchapp"}:
                    continue
                with contextlib.suppress(CommandError):  # an app without migrations
                    call_command("migrate", config.label, database="sqlite", verbosity=0)
            yield path
    finally:
        wrapper.close()
        connections["sqlite"] = original


@pytest.fixture
def start_sqlite_worker(start_worker: StartWorker, database: Path) -> StartWorker:
    """Start ``runjobworker`` subprocesses on the SQLite file."""

    def start(*args: str, **env: str) -> WorkerProcess:
        return start_worker(*args, DJANGO_JOBS_SQLITE=str(database), **env)

    return start


def runs() -> Any:
    return JobRun.objects.using("sqlite")


def statuses(started: list[JobRun]) -> set[str]:
    return set(runs().filter(pk__in=[run.pk for run in started]).values_list("status", flat=True))


def effects(name: str, started: list[JobRun]) -> list[int]:
    """How many times each of ``started`` performed the side effect ``name``, in order."""
    done = Counter(
        Execution.objects.using("sqlite")
        .filter(job_type=name, run_id__in=[run.pk for run in started])
        .values_list("run_id", flat=True)
    )
    return [done[run.pk] for run in started]


def seed_schedule(missed: int) -> None:
    """Store a last tick ``missed`` minutes ago: the worker's scheduler catches up."""
    last = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=missed)
    JobSchedule.objects.using("sqlite").create(
        name=SCHEDULE,
        job_type="tests.record",
        cron="* * * * *",
        timezone="UTC",
        missed="catch_up",
        last_tick=last,
        created_at=last - timedelta(days=1),
    )


def attempts(started: list[JobRun]) -> set[int]:
    return set(runs().filter(pk__in=[run.pk for run in started]).values_list("attempts", flat=True))


# "": the worker's settings leave transaction_mode unset, as most projects' do.
@pytest.mark.parametrize("mode", ["IMMEDIATE", ""])
def test_four_threads_run_every_durable_feature(
    start_sqlite_worker: StartWorker, mode: str
) -> None:
    seed_schedule(missed=3)
    three = start_many("tests.three_steps", [{"fail_c_until": 2}] * 40)
    atomic = start_many("tests.atomic_step", [{}] * 20)
    atomic_fails = start_many("tests.atomic_step_fails", [{}] * 20)
    loops = start_many("tests.loop_steps", [{}] * 20)
    parents = start_many("tests.parent", [{"n": 3, "child": "tests.record"}] * 20)
    sleepers = start_many("tests.sleeper", [{"seconds": 0.5}] * 20)
    flaky = start_many("tests.flaky", [{"succeed_on": 2}] * 20)
    slow = start_many("tests.slow", [{"seconds": 2}] * 2)
    # Its children go to a pool no worker serves: it waits until canceled.
    waiting = start("tests.parent", {"n": 3, "child": "tests.echo"})

    worker = start_sqlite_worker(
        "--pool",
        "default",
        "--concurrency",
        "4",
        DJANGO_SETTINGS_MODULE="tests.process.schedule_settings",
        DJANGO_JOBS_SQLITE_MODE=mode,
    )
    retried = [*three, *atomic, *atomic_fails, *loops, *flaky]
    done = [*retried, *parents, *sleepers]
    wait_until(lambda: statuses(done) == {Status.COMPLETED}, timeout=120)
    wait_until(lambda: statuses(slow) == {Status.TIMED_OUT}, timeout=30)
    assert runs().get(pk=waiting.pk).status == Status.WAITING
    assert cancel(waiting.pk) == 4  # the parent and its three pending children
    scheduled = runs().filter(trigger_source="schedule", trigger_ref=SCHEDULE)
    wait_until(lambda: scheduled.filter(status=Status.COMPLETED).count() >= 3, timeout=60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()

    # Steps ran once each, a failed one again on the retry; loops replayed by occurrence.
    assert attempts(retried) == {2}
    assert effects("effect:a", three) == effects("effect:b", three) == [1] * 40
    assert effects("effect:c-started", three) == [2] * 40
    assert effects("effect:c", three) == [1] * 40
    assert effects("effect:send", loops) == [3] * 20
    assert effects("tests.flaky", flaky) == [2] * 20
    # An atomic step's write is kept once, and a failed one's is rolled back.
    assert effects("effect:write", atomic) == effects("effect:write", atomic_fails) == [1] * 20
    # Children completed, each once, and their parents resumed with their outputs.
    children = list(runs().filter(parent_id__in=[run.pk for run in parents]))
    assert len(children) == 60
    assert statuses(children) == {Status.COMPLETED}
    assert effects("tests.record", children) == [1] * 60
    outputs = runs().filter(pk__in=[run.pk for run in parents]).values_list("output", flat=True)
    assert {len(output["outputs"]) for output in outputs} == {3}
    # Sleepers woke and ran their second step once.
    assert effects("effect:before", sleepers) == effects("effect:after", sleepers) == [1] * 20
    slept = runs().filter(pk__in=[run.pk for run in sleepers]).values_list("output", flat=True)
    assert set(slept) == {"rested"}
    # The cancel went down to the waiting parent's children.
    assert statuses([waiting, *runs().filter(parent_id=waiting.pk)]) == {Status.CANCELED}
    assert not runs().filter(status=Status.RUNNING).exists()
    log = worker.output()
    assert "database is locked" not in log
    assert "database error" not in log
    assert "outcome not written" not in log


def test_a_second_worker_is_refused_until_the_first_is_gone(
    start_sqlite_worker: StartWorker, database: Path
) -> None:
    first = start_sqlite_worker("--pool", "default")
    wait_until(lambda: STARTED in first.output(), timeout=60)
    second = start_sqlite_worker("--pool", "default")
    assert second.wait(timeout=60) == 1
    assert second.output().splitlines() == [
        f"CommandError: another django_jobs worker (pid {first.pid}) is running on SQLite "
        f"database {database}; SQLite serves one worker process: run more threads with "
        "--concurrency, or use PostgreSQL or MariaDB for more processes"
    ]
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    # The operating system released the killed worker's lock: a new worker starts.
    third = start_sqlite_worker("--pool", "default")
    wait_until(lambda: STARTED in third.output(), timeout=60)
    run = start("tests.record")
    wait_until(lambda: runs().get(pk=run.pk).status == Status.COMPLETED, timeout=30)
    third.signal(signal.SIGTERM)
    assert third.wait(timeout=30) == 0, third.output()
    assert not Path(f"{database}.django_jobs-worker.lock").exists()


def test_events_and_waits_for_results_on_one_process(start_sqlite_worker: StartWorker) -> None:
    from django_jobs import send_event

    waiting = start_many("tests.approval", [{"count": 2}] * 5)
    async_waiting = start_many("tests.async_approval", [{}] * 5)
    worker = start_sqlite_worker("--pool", "default", "--concurrency", "4")
    both = [*waiting, *async_waiting]
    wait_until(lambda: statuses(both) == {Status.WAITING}, timeout=60)
    for run in both:
        send_event(run, "approved", {"run": run.pk})
    for run in waiting:
        send_event(run, "approved", "second")
    # A caller's wait polls the file (no LISTEN on SQLite).
    assert waiting[0].wait(timeout=60) == [{"run": waiting[0].pk}, "second"]
    wait_until(lambda: statuses(both) == {Status.COMPLETED}, timeout=60)
    assert runs().get(pk=async_waiting[0].pk).output == [{"run": async_waiting[0].pk}]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()
