from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from django_jobs import conf
from django_jobs.checks import (
    check_database,
    check_databases,
    check_deploy,
    check_limited_pools,
    check_routers,
    check_schedules,
    check_settings,
    database_messages,
)


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_defaults_fill_missing_keys(settings: Any) -> None:
    settings.DJANGO_JOBS = {"POLL_INTERVAL": timedelta(milliseconds=250)}
    current = conf.get()
    assert current.POLL_INTERVAL == 0.25
    assert current.HEARTBEAT_INTERVAL == 10.0
    assert current.MAX_INPUT_BYTES == 1_048_576
    assert current.DATABASE == "default"


def test_settings_unset_means_defaults(settings: Any) -> None:
    del settings.DJANGO_JOBS
    assert conf.get().STALE_THRESHOLD == 60.0
    assert check_settings() == []


def test_valid_settings_pass(settings: Any) -> None:
    settings.DJANGO_JOBS = {"HEARTBEAT_INTERVAL": 5, "STALE_THRESHOLD": timedelta(seconds=30)}
    assert check_settings() == []


def test_unknown_key_is_an_error_naming_it(settings: Any) -> None:
    settings.DJANGO_JOBS = {"POLL_INTERVALL": 1}
    messages = check_settings()
    assert ids(messages) == ["django_jobs.E001"]
    assert "'POLL_INTERVALL'" in messages[0].msg
    assert "POLL_INTERVAL" in messages[0].hint


@pytest.mark.parametrize(
    "value",
    [
        {"POLL_INTERVAL": -1},
        {"POLL_INTERVAL": float("nan")},
        {"SHUTDOWN_TIMEOUT": float("inf")},
        {"HEARTBEAT_INTERVAL": 1e12},
        {"CANCEL_GRACE": timedelta(days=8)},
        {"POLL_INTERVAL": "1s"},
        {"MAX_INPUT_BYTES": 0},
        {"LISTEN_NOTIFY": "yes"},
    ],
)
def test_bad_values_are_errors(settings: Any, value: dict[str, Any]) -> None:
    settings.DJANGO_JOBS = value
    assert ids(check_settings()) == ["django_jobs.E001"]


def test_settings_must_be_a_dict(settings: Any) -> None:
    settings.DJANGO_JOBS = ["POLL_INTERVAL"]
    assert ids(check_settings()) == ["django_jobs.E001"]


def test_unknown_database_alias(settings: Any) -> None:
    settings.DJANGO_JOBS = {"DATABASE": "jobs"}
    assert ids(check_settings()) == ["django_jobs.E002"]


def test_stale_threshold_must_cover_three_heartbeats(settings: Any) -> None:
    settings.DJANGO_JOBS = {"HEARTBEAT_INTERVAL": 10, "STALE_THRESHOLD": 20}
    assert ids(check_settings()) == ["django_jobs.E003"]


def test_use_tz_off_is_an_error(settings: Any) -> None:
    settings.USE_TZ = False
    assert "django_jobs.E004" in ids(check_settings())


def test_every_problem_is_reported_at_once(settings: Any) -> None:
    # One bad key used to hide E002, E003 and E004 until it was fixed.
    settings.USE_TZ = False
    settings.DJANGO_JOBS = {
        "POLL_INTERVALL": 1,
        "LISTEN_NOTIFY": "yes",
        "DATABASE": "jobs",
        "HEARTBEAT_INTERVAL": 10,
        "STALE_THRESHOLD": 20,
        "SCHEDULES": {"nightly": {"job_type": "tests.noop", "cron": "61 * * * *"}},
    }
    messages = check_settings() + check_schedules()
    assert ids(messages) == [
        "django_jobs.E001",
        "django_jobs.E001",
        "django_jobs.E002",
        "django_jobs.E003",
        "django_jobs.E004",
        "django_jobs.E010",
    ]


def test_a_check_on_invalid_values_is_skipped_not_crashed(settings: Any) -> None:
    # E003 compares two durations: one is invalid (E001), so E003 says nothing.
    settings.DJANGO_JOBS = {"HEARTBEAT_INTERVAL": "10s", "STALE_THRESHOLD": 1, "DATABASE": 3}
    assert ids(check_settings()) == ["django_jobs.E001", "django_jobs.E001"]


def test_a_sqlite_file_gets_a_single_process_warning() -> None:
    connection = _connection("sqlite", "SQLite", "db.sqlite3", transaction_mode="IMMEDIATE")
    [message] = database_messages(connection, "default")
    assert message.id == "django_jobs.W001"
    assert "serves one worker process" in message.msg


@pytest.mark.parametrize("name", [":memory:", "file:memorydb_default?mode=memory&cache=shared"])
def test_an_in_memory_sqlite_database_gets_no_warning(name: str) -> None:
    # Each connection has its own database there: no worker process can share
    # it, so "one worker process only" would only be noise (a test database).
    assert database_messages(_connection("sqlite", "SQLite", name), "default") == []


def test_the_suites_in_memory_sqlite_alias_gets_no_warning() -> None:
    assert check_database("sqlite") == []


@pytest.mark.django_db
def test_the_suites_database_is_served() -> None:
    assert check_database("default") == []


def test_database_check_runs_only_for_the_jobs_alias(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connections

    # A file's name (never opened: the checks of SQLite do not connect).
    monkeypatch.setitem(connections["sqlite"].settings_dict, "NAME", "/nonexistent/db.sqlite3")
    settings.DJANGO_JOBS = {"DATABASE": "sqlite"}
    assert check_databases(databases=None) == []
    assert check_databases(databases=["default"]) == []
    assert ids(check_databases(databases=["sqlite"])) == ["django_jobs.W001", "django_jobs.W002"]


def _connection(
    vendor: str, display_name: str, name: str = ":memory:", *, more: Any = None, **options: Any
) -> Any:
    from types import SimpleNamespace

    settings = {"NAME": name, "OPTIONS": options}
    return SimpleNamespace(
        vendor=vendor, display_name=display_name, settings_dict=settings, **(more or {})
    )


class _Clock:
    """A cursor whose session clock is ``offset`` seconds from UTC."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __enter__(self) -> _Clock:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def execute(self, sql: str, params: Any = None) -> None:
        assert "UTC_TIMESTAMP" in sql

    def fetchone(self) -> tuple[int]:
        return (self.offset,)


def _mysql(mariadb: bool, version: tuple[int, ...], engine: str = "InnoDB", offset: int = 0) -> Any:
    from types import SimpleNamespace

    return _connection(
        "mysql",
        "MariaDB" if mariadb else "MySQL",
        more={
            "mysql_is_mariadb": mariadb,
            "mysql_version": version,
            "features": SimpleNamespace(_mysql_storage_engine=engine),
            "cursor": lambda: _Clock(offset),
        },
    )


def test_a_database_django_jobs_does_not_run_on_is_refused() -> None:
    [message] = database_messages(_connection("oracle", "Oracle"), "jobs")
    assert message.id == "django_jobs.E005"
    assert message.is_serious()
    assert "does not run on Oracle" in message.msg
    assert "MariaDB 10.6" in str(message.hint)


@pytest.mark.parametrize(
    ("connection", "reason"),
    [
        (_mysql(True, (10, 5, 24)), "MariaDB 10.5.24 is too old"),
        (_mysql(False, (5, 7, 44)), "MySQL 5.7.44 is too old"),
        (_mysql(False, (8, 0, 16)), "needs MySQL 8.0.17 or later"),
        (_mysql(True, (10, 11, 9), engine="MyISAM"), "MyISAM, which has no row locks"),
        (_mysql(False, (8, 4, 3), offset=3600), "time zone is not UTC"),
    ],
)
def test_mysql_and_mariadb_without_what_django_jobs_needs_are_refused(
    connection: Any, reason: str
) -> None:
    [message] = database_messages(connection, "jobs")
    assert message.id == "django_jobs.E005"
    assert reason in message.msg


def test_mariadb_10_6_and_mysql_8_are_served() -> None:
    assert database_messages(_mysql(True, (10, 6, 0)), "jobs") == []
    assert database_messages(_mysql(False, (8, 0, 17)), "jobs") == []


def test_postgresql_and_sqlite_are_served() -> None:
    assert database_messages(_connection("postgresql", "PostgreSQL"), "default") == []
    connection = _connection("sqlite", "SQLite", "db.sqlite3", transaction_mode="IMMEDIATE")
    assert ids(database_messages(connection, "x")) == ["django_jobs.W001"]


def test_a_sqlite_file_without_immediate_transactions_is_warned_of() -> None:
    messages = database_messages(_connection("sqlite", "SQLite", "db.sqlite3"), "default")
    assert ids(messages) == ["django_jobs.W001", "django_jobs.W002"]
    assert "database is locked" in messages[1].msg
    assert messages[1].hint == (
        'Add "OPTIONS": {"transaction_mode": "IMMEDIATE"} to DATABASES[\'default\'] '
        "(docs/installation.md)."
    )


@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate", "EXCLUSIVE"])
def test_a_sqlite_file_taking_the_write_lock_at_begin_is_not_warned_of(mode: str) -> None:
    connection = _connection("sqlite", "SQLite", "db.sqlite3", transaction_mode=mode)
    assert ids(database_messages(connection, "default")) == ["django_jobs.W001"]


# --- the hint of a value's E001 ----------------------------------------------------------


def test_a_bad_value_is_not_answered_with_the_list_of_keys(settings: Any) -> None:
    settings.DJANGO_JOBS = {"RETENTION": float("inf")}  # "forever" is None
    [message] = check_settings()
    assert message.msg == (
        "DJANGO_JOBS: RETENTION must be from a minute to 100 years (or None), got inf."
    )
    assert message.hint == "See docs/settings.md for the values each key takes."


# --- RUN_ON_COMMIT in production (check --deploy) ---------------------------------------


def test_run_on_commit_is_a_deploy_warning(settings: Any) -> None:
    from django.core.checks import run_checks

    settings.DJANGO_JOBS = {"RUN_ON_COMMIT": True}
    assert ids(check_deploy()) == ["django_jobs.W003"]
    deploy = run_checks(include_deployment_checks=True, databases=[])
    assert "django_jobs.W003" in ids(deploy)
    # Not in a plain check: the settings of a project's tests set it.
    assert "django_jobs.W003" not in ids(run_checks(databases=[]))
    settings.DJANGO_JOBS = {"RUN_ON_COMMIT": False}
    assert check_deploy() == []


# --- pools the settings limit that no run is sent to --------------------------------------

QUEUES = {"default": {"BACKEND": "django_jobs.tasks_backend.JobsBackend", "QUEUES": ["tasks"]}}


def test_a_limit_on_a_pool_no_run_is_sent_to_is_warned_of(settings: Any) -> None:
    settings.TASKS = QUEUES
    settings.DJANGO_JOBS = {
        # echo: a @job's pool (tests.echo); tasks: a queue of the backend.
        "RATE_LIMITS": {"echo": "5/s", "tasks": "1/s", "emials": "100/m"},
        "TENANT_CONCURRENCY": {"*": 3, "echo": 2, "reprots": 1},
    }
    messages = check_limited_pools()
    assert [(m.id, m.msg) for m in messages] == [
        (
            "django_jobs.W004",
            "DJANGO_JOBS['RATE_LIMITS'] names pool 'emials', which no @job, tasks queue or "
            "JOB_OPTIONS entry sends runs to: it limits no run.",
        ),
        (
            "django_jobs.W004",
            "DJANGO_JOBS['TENANT_CONCURRENCY'] names pool 'reprots', which no @job, tasks queue "
            "or JOB_OPTIONS entry sends runs to: it limits no run.",
        ),
    ]
    assert "SILENCED_SYSTEM_CHECKS" in messages[0].hint


def test_a_pool_job_options_send_runs_to_may_be_limited(settings: Any) -> None:
    settings.TASKS = QUEUES
    settings.DJANGO_JOBS = {
        "RATE_LIMITS": {"wagtail": "5/s"},
        "JOB_OPTIONS": {"wagtail.*": {"pool": "wagtail"}},
    }
    assert check_limited_pools() == []


def test_a_backend_taking_any_queue_may_send_runs_to_any_pool(settings: Any) -> None:
    # The suite's TASKS: QUEUES = [] lets a task name any queue.
    settings.DJANGO_JOBS = {"RATE_LIMITS": {"emials": "100/m"}}
    assert check_limited_pools() == []


# --- routers ----------------------------------------------------------------------------


class JobsElsewhere:
    """A router that keeps django_jobs' tables out of every database but "sqlite"."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == "django_jobs":
            return db == "sqlite"
        return None


def test_a_router_keeping_the_tables_out_of_the_jobs_database_is_an_error(
    settings: Any,
) -> None:
    assert check_routers() == []
    settings.DATABASE_ROUTERS = [f"{__name__}.JobsElsewhere"]
    [message] = check_routers()
    assert message.id == "django_jobs.E016"
    assert message.msg == (
        "DATABASE_ROUTERS keep migrate from creating django_jobs' tables in the jobs database "
        "'default': workers and enqueues would find no table there."
    )
    assert "migrate --database default" in str(message.hint)
    settings.DJANGO_JOBS = {"DATABASE": "sqlite"}
    assert check_routers() == []


class StepsElsewhere:
    def allow_migrate(self, db: str, app_label: str, model_name: str = "", **hints: Any) -> bool:
        return model_name != "jobstep"


def test_a_router_refusing_some_tables_names_them(settings: Any) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.StepsElsewhere"]
    [message] = check_routers()
    assert "django_jobs' tables JobStep in the jobs database 'default'" in message.msg
