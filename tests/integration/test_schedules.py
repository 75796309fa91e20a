"""Schedules against PostgreSQL: exactly one run per tick, missed ticks, the worker's scheduler."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin import site
from django.db import OperationalError, connections, transaction
from django.test import Client

from django_jobs import Schedule, job, scheduler
from django_jobs.admin.schedules import JobScheduleAdmin
from django_jobs.models import JobRun, JobSchedule, Status
from django_jobs.registry import JobHandler, all_handlers, unregister
from django_jobs.scheduler import (
    ERROR_RETRY,
    RELOAD_INTERVAL,
    Scheduler,
    fire,
    run_schedules,
    sync,
)
from django_jobs.schedules import CATCH_UP_LIMIT, Entry, entries
from django_jobs.testing import drain
from django_jobs.worker import JobWorker
from tests.helpers import lock_waiters, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


Declare = Callable[..., JobHandler]


@pytest.fixture
def declare() -> Iterator[Declare]:
    """Register ``@job``s with schedules for one test; unregister them after."""
    names: list[str] = []

    def declare(job_type: str, schedule: str | Schedule, pool: str = "default") -> JobHandler:
        names.append(job_type)

        def handler(ctx: Any) -> str:
            return ctx.run.run_at.isoformat()  # type: ignore[no-any-return]

        return job(job_type, pool=pool, schedule=schedule)(handler)

    yield declare
    for name in names:
        unregister(name)


def entry(name: str) -> Entry:
    (found,) = [e for e in entries(all_handlers()) if e.name == name]
    return found


def seed(name: str, last_tick: datetime) -> None:
    """Pretend the schedule's latest handled tick was ``last_tick``."""
    sync([entry(name)], last_tick)
    assert JobSchedule.objects.filter(name=name).update(last_tick=last_tick) == 1


def run_ats(job_type: str) -> list[datetime]:
    return list(
        JobRun.objects.filter(job_type=job_type).order_by("run_at").values_list("run_at", flat=True)
    )


# --- one process, an injected clock --------------------------------------------------


def test_first_sight_starts_nothing_then_each_tick_once(declare: Declare) -> None:
    declare("sched.quarter", Schedule("*/15 * * * *", timezone="UTC"))
    assert run_schedules(utc(2026, 1, 1, 10, 7)) == []
    row = JobSchedule.objects.get()
    assert (row.name, row.job_type, row.cron, row.timezone, row.missed) == (
        "sched.quarter",
        "sched.quarter",
        "*/15 * * * *",
        "UTC",
        "skip",
    )
    assert (row.last_tick, row.next_tick, row.created_at) == (
        None,
        utc(2026, 1, 1, 10, 15),
        utc(2026, 1, 1, 10, 7),
    )
    assert run_schedules(utc(2026, 1, 1, 10, 14, 59)) == []
    (run,) = run_schedules(utc(2026, 1, 1, 10, 15, 2))
    run.refresh_from_db()
    assert (run.run_at, run.trigger_source, run.trigger_ref, run.idempotency_key) == (
        utc(2026, 1, 1, 10, 15),
        "schedule",
        "sched.quarter",
        "schedule:sched.quarter:2026-01-01T10:15:00Z",
    )
    assert (run.pool, run.status, run.input) == ("default", Status.PENDING, {})
    assert run_schedules(utc(2026, 1, 1, 10, 15, 40)) == []
    row.refresh_from_db()
    assert (row.last_tick, row.next_tick) == (utc(2026, 1, 1, 10, 15), utc(2026, 1, 1, 10, 30))
    assert JobRun.objects.count() == 1


def test_settings_schedules_run_their_job_with_their_input(settings: Any) -> None:
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "SCHEDULES": {
            "echo.hourly": {
                "job_type": "tests.echo",
                "cron": "@hourly",
                "timezone": "Asia/Tokyo",
                "input": {"hello": "world"},
            }
        },
    }
    run_schedules(utc(2026, 1, 1, 9, 30))
    (run,) = run_schedules(utc(2026, 1, 1, 10, 0, 1))
    assert (run.job_type, run.pool, run.input, run.trigger_ref) == (
        "tests.echo",
        "echo",
        {"hello": "world"},
        "echo.hourly",
    )
    assert run_schedules(utc(2026, 1, 1, 11, 0, 1), pools=["default"]) == []
    assert drain() == 1
    run.refresh_from_db()
    assert run.output == {"hello": "world"}


def test_skip_policy_starts_nothing_for_missed_ticks(
    declare: Declare, caplog: pytest.LogCaptureFixture
) -> None:
    declare("sched.skip", Schedule("*/10 * * * *", timezone="UTC"))
    seed("sched.skip", utc(2026, 1, 1, 10))
    with caplog.at_level(logging.WARNING, logger="django_jobs.scheduler"):
        assert run_schedules(utc(2026, 1, 1, 11, 5)) == []
    assert "schedule=sched.skip missed=skip skipped=6" in caplog.text
    assert JobSchedule.objects.get().last_tick == utc(2026, 1, 1, 11)
    # It resumes with the next tick.
    (run,) = run_schedules(utc(2026, 1, 1, 11, 10, 3))
    assert run.run_at == utc(2026, 1, 1, 11, 10)


def test_catch_up_policy_starts_one_run_per_missed_tick_oldest_first(declare: Declare) -> None:
    declare("sched.catch_up", Schedule("*/10 * * * *", timezone="UTC", missed="catch_up"))
    seed("sched.catch_up", utc(2026, 1, 1, 10))
    runs = run_schedules(utc(2026, 1, 1, 11, 5))
    expected = [utc(2026, 1, 1, 10, 10) + timedelta(minutes=10 * n) for n in range(6)]
    assert [run.run_at for run in runs] == expected
    assert run_ats("sched.catch_up") == expected
    assert run_schedules(utc(2026, 1, 1, 11, 5)) == []
    # Oldest first: the claim order is priority, then run_at. One claim can take
    # them all at one instant; drain() then runs them one by one, in claim order.
    assert drain() == 6
    finished = JobRun.objects.filter(job_type="sched.catch_up").order_by(
        "started_at", "finished_at"
    )
    assert [run.run_at for run in finished] == expected


def test_catch_up_after_long_downtime_is_capped(
    declare: Declare, caplog: pytest.LogCaptureFixture
) -> None:
    declare("sched.capped", Schedule("* * * * *", timezone="UTC", missed="catch_up"))
    seed("sched.capped", utc(2025, 1, 1))
    now = utc(2026, 1, 1, 0, 0, 20)
    with caplog.at_level(logging.WARNING, logger="django_jobs.scheduler"):
        runs = run_schedules(now)
    # A year of minutes, all but the latest 100.
    assert "schedule=sched.capped missed=catch_up skipped=525500 " in caplog.text
    assert len(runs) == CATCH_UP_LIMIT
    assert runs[-1].run_at == utc(2026, 1, 1)
    assert JobSchedule.objects.get().last_tick == utc(2026, 1, 1)


def test_a_row_reset_by_hand_cannot_start_a_second_run_for_a_tick(declare: Declare) -> None:
    declare("sched.reset", Schedule("0 * * * *", timezone="UTC", missed="catch_up"))
    seed("sched.reset", utc(2026, 1, 1, 9, 30))
    (first,) = run_schedules(utc(2026, 1, 1, 10, 0, 5))
    JobSchedule.objects.update(last_tick=utc(2026, 1, 1, 9, 30))
    (again,) = run_schedules(utc(2026, 1, 1, 10, 0, 10))
    assert again.pk == first.pk  # the idempotency key found the stored run
    assert JobRun.objects.count() == 1


def test_a_deleted_row_is_a_first_sight_again(declare: Declare) -> None:
    declare("sched.deleted", Schedule("* * * * *", timezone="UTC", missed="catch_up"))
    seed("sched.deleted", utc(2026, 1, 1, 10))
    handled = entry("sched.deleted")
    JobSchedule.objects.all().delete()
    result = fire(handled, utc(2026, 1, 1, 12))
    assert (result.runs, result.next_tick) == ([], utc(2026, 1, 1, 12, 1))
    assert JobSchedule.objects.get().created_at == utc(2026, 1, 1, 12)


def test_a_changed_declaration_is_written_for_the_admin(declare: Declare) -> None:
    declare("sched.changed", Schedule("0 3 * * *", timezone="UTC"))
    run_schedules(utc(2026, 1, 1))
    unregister("sched.changed")
    declare("sched.changed", Schedule("0 4 * * *", timezone="Europe/Paris", missed="catch_up"))
    run_schedules(utc(2026, 1, 1, 0, 1))
    row = JobSchedule.objects.get()
    assert (row.cron, row.timezone, row.missed, row.next_tick) == (
        "0 4 * * *",
        "Europe/Paris",
        "catch_up",
        utc(2026, 1, 1, 3),
    )


@pytest.mark.parametrize(
    "changed",
    [
        Schedule("0 * * * *", timezone="UTC", missed="catch_up"),  # daily made hourly
        Schedule("0 0 * * *", timezone="America/New_York", missed="catch_up"),  # 05:00 UTC
    ],
)
def test_a_changed_cron_or_zone_counts_its_ticks_from_the_change(
    declare: Declare, changed: Schedule
) -> None:
    declare("sched.rewritten", Schedule("0 0 * * *", timezone="UTC", missed="catch_up"))
    seed("sched.rewritten", utc(2026, 1, 1))
    unregister("sched.rewritten")
    declare("sched.rewritten", changed)
    # Ticks of the new expression since the last handled one were never due.
    assert run_schedules(utc(2026, 1, 1, 12, 30)) == []
    row = JobSchedule.objects.get()
    assert (row.cron, row.timezone) == (changed.cron, changed.zone.key)
    assert row.last_tick == utc(2026, 1, 1, 12, 30)
    assert row.next_tick == changed.next_after(utc(2026, 1, 1, 12, 30))
    (run,) = run_schedules(row.next_tick + timedelta(seconds=5))
    assert run.run_at == row.next_tick


def test_a_cron_changed_before_the_first_tick_counts_from_the_change(declare: Declare) -> None:
    # last_tick is still NULL: MySQL's GREATEST of a NULL is NULL, so the new
    # expression's ticks used to count from the schedule's creation.
    declare("sched.unfired", Schedule("0 0 1 1 *", timezone="UTC", missed="catch_up"))
    assert run_schedules(utc(2026, 1, 1, 10)) == []
    unregister("sched.unfired")
    declare("sched.unfired", Schedule("0 * * * *", timezone="UTC", missed="catch_up"))
    assert run_schedules(utc(2026, 1, 1, 15, 30)) == []
    assert JobSchedule.objects.get().last_tick == utc(2026, 1, 1, 15, 30)
    (run,) = run_schedules(utc(2026, 1, 1, 16, 0, 5))
    assert run.run_at == utc(2026, 1, 1, 16)


def test_a_changed_policy_keeps_the_missed_ticks(declare: Declare) -> None:
    declare("sched.policy", Schedule("0 * * * *", timezone="UTC"))
    seed("sched.policy", utc(2026, 1, 1))
    unregister("sched.policy")
    declare("sched.policy", Schedule("0 * * * *", timezone="UTC", missed="catch_up"))
    runs = run_schedules(utc(2026, 1, 1, 3, 0, 5))
    assert [run.run_at for run in runs] == [utc(2026, 1, 1, hour) for hour in (1, 2, 3)]


# --- two real connections racing one tick ------------------------------------------------


@pytest.mark.parametrize("first_commits", [True, False])
def test_the_second_worker_waits_for_the_first_and_starts_nothing(
    declare: Declare, first_commits: bool
) -> None:
    declare("sched.race", Schedule("*/5 * * * *", timezone="UTC"))
    seed("sched.race", utc(2026, 1, 1, 10))
    handled, now = entry("sched.race"), utc(2026, 1, 1, 10, 5, 1)
    holding, release = threading.Event(), threading.Event()

    def first() -> int:
        # Fires, then keeps its transaction (and the row lock) open.
        with transaction.atomic():
            runs = fire(handled, now).runs
            holding.set()
            assert release.wait(30)
            if not first_commits:
                transaction.set_rollback(True)
        return len(runs)

    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(lambda: _closing(first))
        assert holding.wait(30)
        two = pool.submit(lambda: _closing(lambda: len(fire(handled, now).runs)))
        # The second worker's conditional UPDATE waits on the first's row lock.
        wait_until(lambda: lock_waiters() == 1, timeout=10)
        assert not two.done()
        release.set()
        started = (one.result(timeout=30), two.result(timeout=30))
    assert started == ((1, 0) if first_commits else (1, 1))
    (run,) = JobRun.objects.all()
    assert run.run_at == utc(2026, 1, 1, 10, 5)
    assert JobSchedule.objects.get().last_tick == utc(2026, 1, 1, 10, 5)


def _closing(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    finally:
        connections.close_all()


def test_many_workers_racing_every_tick_start_one_run_each(declare: Declare) -> None:
    declare("sched.stampede", Schedule("* * * * *", timezone="UTC", missed="catch_up"))
    seed("sched.stampede", utc(2026, 1, 1, 10))
    workers, rounds = 6, 10
    for minute in range(1, rounds + 1):
        now = utc(2026, 1, 1, 10, minute, 1)
        barrier = threading.Barrier(workers)

        def race(_: int, now: datetime = now, barrier: threading.Barrier = barrier) -> int:
            barrier.wait(timeout=10)
            return len(_closing(lambda: run_schedules(now)))

        with ThreadPoolExecutor(workers) as pool:
            assert sum(pool.map(race, range(workers))) == 1
    expected = [utc(2026, 1, 1, 10, minute) for minute in range(1, rounds + 1)]
    assert run_ats("sched.stampede") == expected


# --- the worker's scheduler -----------------------------------------------------------


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_scheduler_touches_the_database_only_at_ticks_and_reloads(
    declare: Declare, django_assert_num_queries: Any
) -> None:
    declare("sched.cheap", Schedule("0 * * * *", timezone="UTC"))
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    cheap = Scheduler(["default"], threading.Event(), clock=clock)
    # Synced and read; the next tick is 59.5 minutes away, the next read 5 seconds.
    assert cheap.step() == RELOAD_INTERVAL
    clock.now = utc(2026, 1, 1, 10, 0, 32)
    with django_assert_num_queries(0):
        assert cheap.step() == pytest.approx(RELOAD_INTERVAL - 2)
    clock.now = utc(2026, 1, 1, 10, 0, 35)
    with django_assert_num_queries(1):  # which rows changed: none
        assert cheap.step() == RELOAD_INTERVAL
    clock.now = utc(2026, 1, 1, 10, 59, 59)
    assert cheap.step() == pytest.approx(1.0)
    clock.now = utc(2026, 1, 1, 11, 0, 0)
    assert cheap.step() == pytest.approx(RELOAD_INTERVAL - 1)  # read a second ago
    assert run_ats("sched.cheap") == [utc(2026, 1, 1, 11)]


def test_scheduler_serves_only_its_pools_schedules(declare: Declare) -> None:
    declare("sched.mine", "@hourly")
    declare("sched.theirs", "@hourly", pool="elsewhere")
    assert [e.name for e in Scheduler(["default"], threading.Event()).entries] == ["sched.mine"]
    assert [e.name for e in Scheduler(None, threading.Event()).entries] == [
        "sched.mine",
        "sched.theirs",
    ]


def test_scheduler_survives_database_errors_and_bad_schedules(
    declare: Declare,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    declare("sched.big", Schedule("* * * * *", timezone="UTC", input={"blob": "x" * 100}))
    declare("sched.fine", Schedule("* * * * *", timezone="UTC"))
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    survivor = Scheduler(["default"], threading.Event(), clock=clock)
    survivor.step()
    # The input grew past the limit since the schedule was declared: this one fails.
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "MAX_INPUT_BYTES": 50}
    real_fire = scheduler.fire
    outage = [OperationalError("the database went away")]

    def flaky_fire(entry: Entry, now: datetime) -> Any:
        if outage:
            raise outage.pop()
        return real_fire(entry, now)

    monkeypatch.setattr(scheduler, "fire", flaky_fire)
    clock.now = utc(2026, 1, 1, 10, 1, 1)
    with caplog.at_level(logging.WARNING, logger="django_jobs.scheduler"):
        assert survivor.step() == 1.0  # backoff after the outage
        assert survivor.step() == RELOAD_INTERVAL
    assert survivor.due is not None
    assert survivor.due["sched.big"] == clock.now + ERROR_RETRY  # the big one retries in 30 s
    assert "scheduler database error (the database went away); retrying in 1.0s" in caplog.text
    assert "schedule=sched.big could not start its run" in caplog.text
    assert run_ats("sched.fine") == [utc(2026, 1, 1, 10, 1)]
    assert run_ats("sched.big") == []
    assert JobSchedule.objects.get(name="sched.big").last_tick is None  # rolled back


class Unsyncable(Schedule):
    def next_after(self, instant: datetime) -> datetime:
        raise ValueError("no next tick")


def test_a_schedule_that_cannot_sync_does_not_stop_the_others(
    declare: Declare, caplog: pytest.LogCaptureFixture
) -> None:
    declare("sched.broken", "* * * * *")
    declare("sched.healthy", Schedule("* * * * *", timezone="UTC"))
    broken = Entry("sched.broken", "sched.broken", "default", Unsyncable("* * * * *"))
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    survivor = Scheduler(["default"], threading.Event(), clock=clock)
    survivor.entries = [broken, entry("sched.healthy")]
    with caplog.at_level(logging.ERROR, logger="django_jobs.scheduler"):
        survivor.step()
        assert survivor.due is not None
        assert survivor.due["sched.broken"] == clock.now + ERROR_RETRY  # tried again in 30 s
        clock.now = utc(2026, 1, 1, 10, 1, 1)
        survivor.step()
        assert survivor.due["sched.broken"] == clock.now + ERROR_RETRY
    assert caplog.text.count("schedule=sched.broken could not be synced; retrying later") == 2
    assert run_ats("sched.healthy") == [utc(2026, 1, 1, 10, 1)]
    assert list(JobSchedule.objects.values_list("name", flat=True)) == ["sched.healthy"]


def test_worker_catches_up_missed_ticks_and_runs_them(declare: Declare) -> None:
    declare("sched.worker", Schedule("* * * * *", timezone="UTC", missed="catch_up"))
    last = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=3)
    seed("sched.worker", last)
    worker = JobWorker(["default"], concurrency=2, poll_interval=0.05)
    thread = threading.Thread(target=lambda: _closing(worker.run))
    thread.start()
    try:
        wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() >= 3)
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    ticks = run_ats("sched.worker")
    assert ticks[:3] == [last + timedelta(minutes=n) for n in (1, 2, 3)]
    assert len(ticks) == len(set(ticks))
    assert not any(t.name == "django-jobs-scheduler" for t in threading.enumerate())


def test_scheduler_thread_runs_unless_asked_not_to(declare: Declare) -> None:
    # Schedules may be added at run time, so it runs also while the pools have none.
    assert JobWorker(["default"], scheduler=False).start_scheduler() is None
    declare("sched.thread", "@hourly")
    for pools in (["elsewhere"], ["default"]):
        worker = JobWorker(pools)
        thread = worker.start_scheduler()
        assert thread is not None
        assert thread.name == "django-jobs-scheduler"
        if pools == ["default"]:
            wait_until(lambda: JobSchedule.objects.filter(name="sched.thread").exists())
        worker.stopping.set()
        thread.join(10)
        assert not thread.is_alive()


# --- admin --------------------------------------------------------------------------


def test_admin_lists_code_schedules_read_only(declare: Declare, admin_client: Client) -> None:
    declare("sched.admin", Schedule("0 3 * * *", timezone="Europe/Paris"))
    run_schedules()
    page = admin_client.get("/admin/django_jobs/jobschedule/")
    assert page.status_code == 200
    assert b"sched.admin" in page.content
    assert b"Europe/Paris" in page.content
    detail = admin_client.get("/admin/django_jobs/jobschedule/sched.admin/change/")
    assert detail.status_code == 200
    assert b"State:" in detail.content
    assert b'name="cron"' not in detail.content  # declared in code: read-only
    gone = JobSchedule.objects.create(
        name="sched.gone", job_type="sched.gone", cron="@daily", timezone="UTC", missed="skip"
    )
    model_admin = site._registry[JobSchedule]
    assert isinstance(model_admin, JobScheduleAdmin)
    assert model_admin.declared(JobSchedule.objects.get(name="sched.admin"))
    assert not model_admin.declared(gone)
    assert not model_admin.overdue(gone)  # no next tick stored
    gone.next_tick = utc(2020, 1, 1)
    assert model_admin.overdue(gone)


# --- the start line -------------------------------------------------------------------


def test_the_start_line_names_the_schedules_or_says_none(
    declare: Declare, caplog: pytest.LogCaptureFixture
) -> None:
    def started(pools: list[str]) -> str:
        stop = threading.Event()
        stop.set()  # the thread's loop ends at once: only its start line is logged
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="django_jobs.scheduler"):
            Scheduler(pools, stop).run()
        (line,) = [m for r in caplog.records if "scheduler started" in (m := r.getMessage())]
        return line

    assert started(["nosuchpool"]) == "scheduler started schedules=none"
    declare("sched.b", "@daily", pool="mailing")
    declare("sched.a", "@hourly", pool="mailing")
    assert started(["mailing"]) == "scheduler started schedules=sched.a,sched.b"


def test_a_long_list_of_names_is_cut() -> None:
    names = [f"s{n:03}" for n in range(25)]
    assert scheduler.listed(names[:2]) == "s000,s001"
    assert scheduler.listed(reversed(names)) == ",".join(names[:20]) + ",...,+5"
    assert scheduler.listed([]) == "none"
