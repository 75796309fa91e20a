"""Schedules managed at run time: the API's checks and records, pause and resume, task
targets, and the scheduler seeing changes under an injected clock."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection, connections, transaction

import django_jobs
from django_jobs import (
    Schedule,
    add_schedule,
    change_schedule,
    delete_schedule,
    job,
    pause_schedule,
    resume_schedule,
)
from django_jobs.exceptions import InvalidSchedule, ScheduleNotFound
from django_jobs.models import JobRun, JobSchedule, ScheduleSource
from django_jobs.payloads import MAX_DEPTH
from django_jobs.registry import JobHandler, unregister
from django_jobs.schedule_targets import runtime_entry
from django_jobs.scheduler import RELOAD_INTERVAL, Scheduler, fire, run_schedules
from django_jobs.schedules import CATCH_UP_LIMIT
from django_jobs.tasks_compat import task_backends
from django_jobs.testing import drain
from tests.helpers import lock_waiters, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


DEEPER: Any = 0
for _ in range(MAX_DEPTH + 1):
    DEEPER = [DEEPER]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def user() -> User:
    return User.objects.create_user("ops", password="x", is_staff=True)


@pytest.fixture
def declared() -> Iterator[Callable[[str, str], JobHandler]]:
    """Register ``@job``s with a schedule in code for one test."""
    names: list[str] = []

    def declare(job_type: str, cron: str) -> JobHandler:
        names.append(job_type)
        return job(job_type, schedule=Schedule(cron, timezone="UTC"))(lambda ctx: None)

    yield declare
    for name in names:
        unregister(name)


def made_at(name: str, when: datetime, last_tick: datetime | None = None) -> None:
    """Pretend schedule ``name`` was added at ``when`` (and handled up to ``last_tick``)."""
    JobSchedule.objects.filter(name=name).update(created_at=when, last_tick=last_tick)


def ticks(name: str) -> list[datetime]:
    runs = JobRun.objects.filter(idempotency_key__startswith=f"schedule:{name}:")
    return list(runs.order_by("run_at").values_list("run_at", flat=True))


def logged(name: str) -> list[tuple[int, str, int]]:
    entries = LogEntry.objects.filter(object_id=name).order_by("pk")
    return [(e.action_flag, e.get_change_message(), e.user_id) for e in entries]


# --- adding -----------------------------------------------------------------------------


def test_an_added_schedule_starts_runs_from_its_first_tick() -> None:
    row = add_schedule("ops.quarter", "tests.record", "*/15 * * * *", input={"n": 1})
    assert (row.source, row.timezone, row.missed, row.input, row.revision) == (
        ScheduleSource.RUNTIME,
        "UTC",  # settings.TIME_ZONE, stored by name
        "skip",
        {"n": 1},
        1,
    )
    made_at("ops.quarter", utc(2026, 1, 1, 10, 7))
    assert run_schedules(utc(2026, 1, 1, 10, 14)) == []
    (run,) = run_schedules(utc(2026, 1, 1, 10, 15, 2))
    assert (run.job_type, run.input, run.run_at, run.trigger_source, run.trigger_ref) == (
        "tests.record",
        {"n": 1},
        utc(2026, 1, 1, 10, 15),
        "schedule",
        "ops.quarter",
    )
    assert run.idempotency_key == "schedule:ops.quarter:2026-01-01T10:15:00Z"
    assert run_schedules(utc(2026, 1, 1, 10, 15, 40)) == []
    # A schedule of another pool's job is left to that pool's workers.
    add_schedule("ops.echo", "tests.echo", "* * * * *")
    made_at("ops.echo", utc(2026, 1, 1, 10, 7))
    assert run_schedules(utc(2026, 1, 1, 10, 30, 1), pools=["default"])[0].job_type == (
        "tests.record"
    )
    assert ticks("ops.echo") == []


def test_the_async_forms_do_the_same() -> None:
    async_to_sync(django_jobs.aadd_schedule)("ops.async", "tests.noop", "@daily")
    assert async_to_sync(django_jobs.apause_schedule)("ops.async") is True
    assert async_to_sync(django_jobs.aresume_schedule)("ops.async") is True
    row = async_to_sync(django_jobs.achange_schedule)("ops.async", cron="@hourly")
    assert row.cron == "@hourly"
    async_to_sync(django_jobs.adelete_schedule)("ops.async")
    assert not JobSchedule.objects.exists()


@pytest.mark.parametrize(
    ("arguments", "field", "message"),
    [
        ({"name": ""}, "name", "name must be a non-empty string"),
        ({"name": 7}, "name", "name must be a non-empty string"),
        ({"name": "x" * 201}, "name", "longer than 200 characters"),
        ({"name": "nightly "}, "name", "whitespace or a control character"),
        ({"name": "night\x1b[2Jly"}, "name", "whitespace or a control character"),
        ({"job_type": "tests.nope"}, "job_type", "no job is registered as 'tests.nope'"),
        ({"job_type": "x" * 201}, "job_type", "of 1-200 characters"),
        ({"job_type": "tests.testapp.tasks.os"}, "job_type", "no job is registered"),
        ({"cron": "0 25 * * *"}, "cron", "hour 25 is out of range"),
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"cron": None}, "cron", "must be a string"),
        ({"cron": "0 " * 600}, "cron", "at most 1000 characters"),
        ({"cron": "0 3 * * *\n0 4"}, "cron", "control character"),
        ({"timezone": "Europe/Pariss"}, "timezone", "unknown time zone 'Europe/Pariss'"),
        ({"timezone": "../../etc/passwd"}, "timezone", "unknown time zone"),
        ({"timezone": "E" * 101}, "timezone", "longer than 100 characters"),
        ({"timezone": 3}, "timezone", "IANA time zone name"),
        ({"missed": "all"}, "missed", "missed must be one of 'skip', 'catch_up'"),
        ({"input": {"when": {1, 2}}}, "input", "not JSON-serializable"),
        ({"input": "x" * 2_000_000}, "input", "more than MAX_INPUT_BYTES"),
        ({"input": DEEPER}, "input", "more than 31 deep"),
        ({"input": "\x00"}, "input", "NUL"),
    ],
)
def test_every_field_is_checked_with_a_clear_error(
    arguments: dict[str, Any], field: str, message: str
) -> None:
    values = {"name": "ops.bad", "job_type": "tests.noop", "cron": "@daily", **arguments}
    name, job_type, cron = values.pop("name"), values.pop("job_type"), values.pop("cron")
    with pytest.raises(InvalidSchedule, match=message) as raised:
        add_schedule(name, job_type, cron, **values)
    assert raised.value.field == field
    assert len(str(raised.value)) < 500  # a hostile value is not echoed whole
    assert not JobSchedule.objects.exists()


def test_input_nests_as_deep_as_a_runs_may() -> None:
    deepest: Any = 0
    for _ in range(MAX_DEPTH):
        deepest = [deepest]
    assert add_schedule("ops.deep", "tests.noop", "@daily", input=deepest).input == deepest


def test_code_and_run_time_schedules_share_one_namespace(
    declared: Callable[[str, str], JobHandler], settings: Any
) -> None:
    declared("ops.coded", "@daily")
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "SCHEDULES": {"ops.in_settings": {"job_type": "tests.noop", "cron": "@daily"}},
    }
    for name in ("ops.coded", "ops.in_settings"):
        with pytest.raises(InvalidSchedule, match="taken by a schedule declared in code"):
            add_schedule(name, "tests.noop", "@hourly")
    add_schedule("ops.once", "tests.noop", "@hourly")
    with pytest.raises(InvalidSchedule, match=r"a schedule named 'ops\.once' exists already"):
        add_schedule("ops.once", "tests.noop", "@daily")
    assert JobSchedule.objects.get().cron == "@hourly"


def test_a_code_schedule_a_run_time_one_took_the_name_of_is_not_scheduled(
    declared: Callable[[str, str], JobHandler], caplog: pytest.LogCaptureFixture
) -> None:
    # Added while no code declared the name; a later deploy declares it.
    add_schedule("ops.later", "tests.record", "0 * * * *", missed="catch_up")
    made_at("ops.later", utc(2026, 1, 1))
    declared("ops.later", "*/5 * * * *")
    with caplog.at_level(logging.ERROR, logger="django_jobs.scheduler"):
        runs = run_schedules(utc(2026, 1, 1, 2, 0, 30))
    assert "schedule=ops.later is declared in code, but a run-time schedule has" in caplog.text
    # The operator's schedule runs unchanged; nothing of the code one.
    assert [(run.job_type, run.run_at.hour) for run in runs] == [
        ("tests.record", 1),
        ("tests.record", 2),
    ]
    row = JobSchedule.objects.get()
    assert (row.source, row.cron, row.job_type) == ("runtime", "0 * * * *", "tests.record")


def test_schedule_names_are_compared_byte_for_byte() -> None:
    # On MySQL and MariaDB the table's binary collation (0002) holds for the columns
    # 0004 added: two names differing in case or a trailing character are two.
    add_schedule("ops.Case", "tests.noop", "@daily")
    add_schedule("ops.case", "tests.noop", "@daily")
    assert JobSchedule.objects.filter(name="ops.case").count() == 1
    assert JobSchedule.objects.filter(source="runtime").count() == 2
    assert not JobSchedule.objects.filter(source="RUNTIME").exists()
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT column_name, collation_name FROM information_schema.columns "
                "WHERE table_schema = DATABASE() AND table_name = 'django_jobs_jobschedule' "
                "AND collation_name IS NOT NULL"
            )
            collations = dict(cursor.fetchall())
        assert collations["source"] in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
        assert collations["name"] == collations["source"]


# --- changing ---------------------------------------------------------------------------


def test_a_changed_input_target_or_policy_applies_from_the_latest_tick() -> None:
    add_schedule("ops.change", "tests.record", "0 * * * *", input={"v": 1})
    made_at("ops.change", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 1))
    row = change_schedule("ops.change", input={"v": 2}, missed="catch_up", job_type="tests.echo")
    assert (row.input, row.missed, row.job_type, row.revision) == (
        {"v": 2},
        "catch_up",
        "tests.echo",
        2,
    )
    assert row.last_tick == utc(2026, 1, 1, 1)  # ticks missed since stay missed: caught up
    runs = run_schedules(utc(2026, 1, 1, 3, 0, 5))
    assert [(r.job_type, r.input, r.run_at.hour) for r in runs] == [
        ("tests.echo", {"v": 2}, 2),
        ("tests.echo", {"v": 2}, 3),
    ]


@pytest.mark.parametrize("handled", [utc(2026, 1, 1, 1), None])
def test_a_changed_cron_or_zone_does_not_replay_past_ticks(handled: datetime | None) -> None:
    add_schedule("ops.recron", "tests.record", "0 0 * * *", missed="catch_up")
    made_at("ops.recron", utc(2026, 1, 1), last_tick=handled)
    now = datetime.now(UTC)
    row = change_schedule("ops.recron", cron="* * * * *", timezone="Asia/Tokyo")
    assert row.last_tick is not None
    assert row.last_tick >= now  # NULL too (MySQL's GREATEST of a NULL is NULL)
    assert row.next_tick == row.last_tick.replace(second=0, microsecond=0) + timedelta(minutes=1)
    # Under catch_up, the new expression's minutes since 2026 would be 100 runs.
    assert run_schedules(row.last_tick + timedelta(seconds=1)) == []


def test_changing_nothing_changes_nothing(user: User) -> None:
    add_schedule("ops.same", "tests.noop", "@daily", user=user)
    assert change_schedule("ops.same", cron="@daily", input={}, user=user).revision == 1
    assert len(logged("ops.same")) == 1


def test_a_code_schedule_is_changed_in_code(
    declared: Callable[[str, str], JobHandler],
) -> None:
    declared("ops.coded", "@daily")
    run_schedules()
    with pytest.raises(InvalidSchedule, match="is declared in code; change it there"):
        change_schedule("ops.coded", cron="@hourly")
    with pytest.raises(InvalidSchedule, match="is declared in code; remove it there"):
        delete_schedule("ops.coded")
    with pytest.raises(ScheduleNotFound, match=r"no schedule named 'ops\.nope'"):
        change_schedule("ops.nope", cron="@hourly")
    add_schedule("ops.valid", "tests.noop", "@daily")
    with pytest.raises(InvalidSchedule, match="hour 25 is out of range"):
        change_schedule("ops.valid", cron="0 25 * * *")
    assert JobSchedule.objects.get(name="ops.valid").cron == "@daily"


def test_the_row_of_a_code_schedule_no_longer_declared_may_be_deleted(
    declared: Callable[[str, str], JobHandler],
) -> None:
    declared("ops.removed", "@daily")
    run_schedules()
    unregister("ops.removed")
    delete_schedule("ops.removed")
    assert not JobSchedule.objects.exists()
    with pytest.raises(ScheduleNotFound):
        delete_schedule("ops.removed")


# --- pause and resume ------------------------------------------------------------------


@pytest.mark.parametrize("source", ["runtime", "code"])
def test_a_paused_schedule_starts_nothing_and_keeps_its_latest_tick(
    declared: Callable[[str, str], JobHandler], source: str
) -> None:
    if source == "code":
        declared("ops.hourly", "0 * * * *")
        assert pause_schedule("ops.hourly") is True  # made paused: no worker had seen it
    else:
        add_schedule("ops.hourly", "tests.noop", "0 * * * *", timezone="UTC", paused=True)
    made_at("ops.hourly", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 1))
    assert pause_schedule("ops.hourly") is False  # paused already
    assert run_schedules(utc(2026, 1, 1, 5, 0, 5)) == []
    row = JobSchedule.objects.get()
    assert (row.source, row.last_tick, row.paused) == (source, utc(2026, 1, 1, 1), True)
    assert resume_schedule("ops.hourly") is True
    assert resume_schedule("ops.hourly") is False
    with pytest.raises(ScheduleNotFound):
        pause_schedule("ops.nope")
    with pytest.raises(ScheduleNotFound):
        resume_schedule("ops.nope")


def test_resumed_under_skip_only_the_tick_still_on_time_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_schedule("ops.skip", "tests.noop", "*/10 * * * *", missed="skip")
    made_at("ops.skip", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 10))
    pause_schedule("ops.skip")
    assert run_schedules(utc(2026, 1, 1, 10, 50, 30)) == []
    resume_schedule("ops.skip")
    with caplog.at_level(logging.WARNING, logger="django_jobs.scheduler"):
        (run,) = run_schedules(utc(2026, 1, 1, 11, 0, 30))
    # 10:10 ... 10:50 are more than 60 s late: skipped; 11:00 is on time.
    assert run.run_at == utc(2026, 1, 1, 11)
    assert "schedule=ops.skip missed=skip skipped=5" in caplog.text
    assert JobSchedule.objects.get().last_tick == utc(2026, 1, 1, 11)
    # Resumed between two ticks, nothing is on time: the next tick is the first.
    pause_schedule("ops.skip")
    resume_schedule("ops.skip")
    assert run_schedules(utc(2026, 1, 1, 11, 45)) == []
    assert run_schedules(utc(2026, 1, 1, 11, 50, 1))[0].run_at == utc(2026, 1, 1, 11, 50)


def test_resumed_under_catch_up_each_missed_tick_runs_up_to_the_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_schedule("ops.catch_up", "tests.noop", "*/10 * * * *", missed="catch_up")
    add_schedule("ops.capped", "tests.noop", "* * * * *", missed="catch_up")
    made_at("ops.catch_up", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 10))
    made_at("ops.capped", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 10))
    pause_schedule("ops.catch_up")
    pause_schedule("ops.capped")
    assert run_schedules(utc(2026, 1, 1, 12, 0, 30)) == []
    resume_schedule("ops.catch_up")
    resume_schedule("ops.capped")
    with caplog.at_level(logging.WARNING, logger="django_jobs.scheduler"):
        run_schedules(utc(2026, 1, 1, 12, 0, 30))
    # Every tick of the pause, oldest first, each once.
    expected = [utc(2026, 1, 1, 10, 10) + timedelta(minutes=10 * n) for n in range(12)]
    assert ticks("ops.catch_up") == expected
    # 120 minutes missed: the latest 100 run, the 20 before are skipped.
    assert len(ticks("ops.capped")) == CATCH_UP_LIMIT
    assert ticks("ops.capped")[0] == utc(2026, 1, 1, 10, 21)
    assert "schedule=ops.capped missed=catch_up skipped=20" in caplog.text
    assert run_schedules(utc(2026, 1, 1, 12, 0, 40)) == []


# --- the record -------------------------------------------------------------------------


def test_every_change_is_a_log_entry_of_its_user(user: User) -> None:
    add_schedule("ops.audited", "tests.noop", "@daily", user=user)
    change_schedule("ops.audited", cron="@hourly", missed="catch_up", user=user)
    pause_schedule("ops.audited", user=user)
    resume_schedule("ops.audited", user=user)
    pause_schedule("ops.audited", user=user)  # resumed: paused again
    assert resume_schedule("ops.audited", user=user) is True
    assert resume_schedule("ops.audited", user=user) is False  # no change, no entry
    delete_schedule("ops.audited", user=user)
    assert logged("ops.audited") == [
        (ADDITION, "Added.", user.pk),
        (CHANGE, "Changed cron and missed.", user.pk),
        (CHANGE, "Paused.", user.pk),
        (CHANGE, "Resumed.", user.pk),
        (CHANGE, "Paused.", user.pk),
        (CHANGE, "Resumed.", user.pk),
        (DELETION, "", user.pk),
    ]
    entry = LogEntry.objects.first()
    assert entry is not None
    assert (entry.content_type.model, entry.object_repr) == ("jobschedule", "ops.audited")


def test_without_a_user_a_change_is_logged_not_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="django_jobs.schedule_api"):
        add_schedule("ops.quiet", "tests.noop", "@daily")
        pause_schedule("ops.quiet")
    assert "schedule=ops.quiet added revision=1 by=code" in caplog.text
    assert "schedule=ops.quiet paused revision=2 by=code" in caplog.text
    assert not LogEntry.objects.exists()
    with pytest.raises(InvalidSchedule, match="must be a saved user"):
        resume_schedule("ops.quiet", user=AnonymousUser())
    assert JobSchedule.objects.get().paused


# --- task targets -----------------------------------------------------------------------


def test_a_schedule_of_a_task_starts_the_runs_enqueue_starts() -> None:
    add_schedule(
        "ops.add", tasks.add.module_path, "0 * * * *", input={"args": [2], "kwargs": {"b": 3}}
    )
    made_at("ops.add", utc(2026, 1, 1, 9, 30))
    (run,) = run_schedules(utc(2026, 1, 1, 10, 0, 1))
    enqueued = tasks.add.enqueue(2, b=3)
    other = JobRun.objects.get(pk=django_jobs.tasks_backend.run_id(enqueued.id))
    fields = ("job_type", "pool", "priority", "input", "trigger_source", "trigger_ref")
    assert [getattr(run, f) for f in fields] == [getattr(other, f) for f in fields]
    assert run.idempotency_key == "schedule:ops.add:2026-01-01T10:00:00Z"
    assert drain() == 2
    result = task_backends["default"].get_result(django_jobs.tasks_backend.result_id(run.pk))
    assert result.return_value == 5


def test_a_task_schedule_checks_its_arguments() -> None:
    path = tasks.add.module_path
    with pytest.raises(InvalidSchedule, match=r'is \{"args": \[...\], "kwargs"') as raised:
        add_schedule("ops.task", path, "@daily", input=[1, 2])
    assert raised.value.field == "input"
    with pytest.raises(InvalidSchedule, match=r"the arguments do not fit .*missing a required"):
        add_schedule("ops.task", path, "@daily", input={"args": [1]})
    with pytest.raises(InvalidSchedule, match='"args" must be a list'):
        add_schedule("ops.task", path, "@daily", input={"args": 1})
    # A task taking its context is given it first, so it does not count.
    flaky = tasks.flaky.module_path
    assert add_schedule("ops.ctx", flaky, "@daily", input={"args": [1]}).input == {
        "args": [1],
        "kwargs": {},
    }


def test_a_task_module_named_by_a_row_is_never_imported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = "tests.testapp.unimported_tasks.never_imported"
    assert "tests.testapp.unimported_tasks" not in sys.modules
    with pytest.raises(InvalidSchedule, match=r"no django\.tasks task with that path is imported"):
        add_schedule("ops.unknown", path, "* * * * *")
    # A row written some other way: the scheduler reads it and imports nothing.
    JobSchedule.objects.create(
        name="ops.unknown",
        source="runtime",
        job_type=path,
        cron="* * * * *",
        timezone="UTC",
        missed="skip",
        input={},
        created_at=utc(2026, 1, 1),
    )
    with caplog.at_level(logging.WARNING, logger="django_jobs.scheduler"):
        assert run_schedules(utc(2026, 1, 1, 0, 5)) == []
    assert "schedule=ops.unknown revision=0 not scheduled" in caplog.text
    assert "tests.testapp.unimported_tasks" not in sys.modules


def test_settings_may_schedule_a_task(settings: Any) -> None:
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "SCHEDULES": {
            "ops.settings_task": {
                "job_type": tasks.echo.module_path,
                "cron": "@hourly",
                "input": {"args": ["hello"]},
            },
            "ops.bad_arguments": {"job_type": tasks.add.module_path, "cron": "@hourly"},
        },
    }
    from django_jobs.checks import check_schedules

    assert [(m.id, m.msg) for m in check_schedules()] == [
        (
            "django_jobs.E009",
            "DJANGO_JOBS['SCHEDULES']['ops.bad_arguments']: the arguments do not fit "
            f"{tasks.add.module_path}: missing a required argument: 'a'.",
        )
    ]
    run_schedules(utc(2026, 1, 1, 9, 30))
    (run,) = run_schedules(utc(2026, 1, 1, 10, 0, 1), pools=["tasks"])
    assert (run.job_type, run.pool, run.input) == (
        tasks.echo.module_path,
        "tasks",
        {"args": ["hello"], "kwargs": {}},
    )


# --- the worker's scheduler sees changes -----------------------------------------------


def test_the_scheduler_sees_changes_at_its_next_read() -> None:
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    scheduler = Scheduler(["default"], threading.Event(), clock=clock)
    scheduler.step()
    add_schedule("ops.seen", "tests.noop", "* * * * *", input={"v": 1})
    made_at("ops.seen", utc(2026, 1, 1, 10))
    clock.now = utc(2026, 1, 1, 10, 1, 1)
    assert scheduler.step() == RELOAD_INTERVAL  # read, then fired
    assert ticks("ops.seen") == [utc(2026, 1, 1, 10, 1)]
    pause_schedule("ops.seen")
    clock.now = utc(2026, 1, 1, 10, 2, 1)
    scheduler.step()
    assert scheduler.due == {}
    resume_schedule("ops.seen")
    change_schedule("ops.seen", input={"v": 2})
    clock.now = utc(2026, 1, 1, 10, 3, 1)
    scheduler.step()  # the minutes 10:02 and 10:03; 10:02 is missed (skip)
    assert ticks("ops.seen") == [utc(2026, 1, 1, 10, 1), utc(2026, 1, 1, 10, 3)]
    assert JobRun.objects.get(run_at=utc(2026, 1, 1, 10, 3)).input == {"v": 2}
    delete_schedule("ops.seen")
    clock.now = utc(2026, 1, 1, 10, 4, 1)
    scheduler.step()
    assert (scheduler.due, scheduler.runtime) == ({}, {})
    assert len(ticks("ops.seen")) == 2


@pytest.mark.parametrize(
    ("before", "again"),
    [
        # Added paused, then deleted and added again, active.
        ({"cron": "* * * * *", "paused": True}, {}),
        # A daily cron added again as every minute, catching up, with a new input:
        # a worker keeping the old row's state would wait for midnight, and then
        # start 100 runs at once.
        ({"cron": "0 0 * * *", "input": {"v": 1}}, {"missed": "catch_up", "input": {"v": 2}}),
    ],
    ids=["paused, again active", "daily, again every minute"],
)
def test_a_schedule_deleted_and_added_again_between_two_rereads_is_a_new_one(
    before: dict[str, Any], again: dict[str, Any]
) -> None:
    """Both rows are at revision 1: the worker tells them apart by their incarnation."""
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    scheduler = Scheduler(["default"], threading.Event(), clock=clock)
    add_schedule("ops.again", "tests.record", timezone="UTC", **before)
    made_at("ops.again", utc(2026, 1, 1, 10))
    scheduler.step()
    with transaction.atomic():
        delete_schedule("ops.again")
        add_schedule("ops.again", "tests.record", "* * * * *", timezone="UTC", **again)
        made_at("ops.again", utc(2026, 1, 1, 10))
    assert JobSchedule.objects.get().revision == 1
    for minute in (1, 2):
        clock.now = utc(2026, 1, 1, 10, minute, 1)
        scheduler.step()
    assert ticks("ops.again") == [utc(2026, 1, 1, 10, 1), utc(2026, 1, 1, 10, 2)]
    assert [run.input for run in JobRun.objects.all()] == [again.get("input", {})] * 2


def test_a_worker_with_a_stale_definition_fires_the_rows() -> None:
    add_schedule("ops.stale", "tests.noop", "0 * * * *", input={"v": 1})
    made_at("ops.stale", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 9))
    stale = runtime_entry(JobSchedule.objects.values().get(name="ops.stale"))
    change_schedule("ops.stale", input={"v": 2}, job_type="tests.record")
    (run,) = fire(stale, utc(2026, 1, 1, 10, 0, 5)).runs
    assert (run.job_type, run.input) == ("tests.record", {"v": 2})
    pause_schedule("ops.stale")
    result = fire(stale, utc(2026, 1, 1, 11, 0, 5))
    assert (result.runs, result.next_tick) == ([], None)
    delete_schedule("ops.stale")
    result = fire(stale, utc(2026, 1, 1, 12, 0, 5))
    assert (result.runs, result.next_tick) == ([], None)


def _closing(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    finally:
        connections.close_all()


@pytest.mark.parametrize("change", ["pause", "delete", "recron"])
def test_a_change_committed_while_a_worker_fires_wins(change: str) -> None:
    """The worker read the row before the change; its UPDATE waits for the change's
    lock, then matches nothing: no run under a definition that no longer holds."""
    add_schedule("ops.race", "tests.noop", "*/5 * * * *", missed="catch_up")
    made_at("ops.race", utc(2026, 1, 1), last_tick=utc(2026, 1, 1, 10))
    entry = runtime_entry(JobSchedule.objects.values().get(name="ops.race"))
    holding, release = threading.Event(), threading.Event()

    def operator() -> None:
        with transaction.atomic():
            if change == "pause":
                pause_schedule("ops.race")
            elif change == "delete":
                delete_schedule("ops.race")
            else:
                change_schedule("ops.race", cron="0 0 1 1 *")
            holding.set()
            assert release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        changing = pool.submit(lambda: _closing(operator))
        assert holding.wait(30)
        firing = pool.submit(lambda: _closing(lambda: fire(entry, utc(2026, 1, 1, 10, 20, 1))))
        wait_until(lambda: lock_waiters() == 1, timeout=10)
        assert not firing.done()
        release.set()
        changing.result(timeout=30)
        fired = firing.result(timeout=30)
    assert fired.runs == []
    assert not JobRun.objects.exists()
    if change == "recron":
        assert fired.next_tick == utc(2027, 1, 1)
    else:
        assert fired.next_tick is None


def test_a_schedule_deleted_under_a_worker_does_not_stop_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_schedule("ops.gone", "tests.noop", "* * * * *")
    add_schedule("ops.kept", "tests.noop", "* * * * *")
    made_at("ops.gone", utc(2026, 1, 1, 10))
    made_at("ops.kept", utc(2026, 1, 1, 10))
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    scheduler = Scheduler(["default"], threading.Event(), clock=clock)
    scheduler.step()
    JobSchedule.objects.filter(name="ops.gone").delete()  # before the worker reads again
    clock.now = utc(2026, 1, 1, 10, 1, 1)
    with caplog.at_level(logging.ERROR, logger="django_jobs.scheduler"):
        scheduler.step()
    assert "Traceback" not in caplog.text
    assert ticks("ops.kept") == [utc(2026, 1, 1, 10, 1)]
    assert ticks("ops.gone") == []
