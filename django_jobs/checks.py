"""System checks: django_jobs.E001... (errors) and django_jobs.W001... (warnings)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections, router

from . import conf


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``settings.DJANGO_JOBS`` and the Django settings the app relies on.

    Every problem is reported at once: a check whose values are themselves
    invalid (E001) is skipped, the others still run.
    """
    messages: list[CheckMessage] = [
        Error(
            f"DJANGO_JOBS: {problem}.",
            hint="Valid keys: " + ", ".join(conf.DEFAULTS) + " (see docs/settings.md)."
            if problem.startswith("unknown key")
            else "See docs/settings.md for the values each key takes.",
            id="django_jobs.E001",
        )
        for problem in conf.problems()
    ]
    values = conf.merged()
    database = values["DATABASE"]
    if isinstance(database, str) and database not in settings.DATABASES:
        messages.append(
            Error(
                f"DJANGO_JOBS['DATABASE'] is {database!r}, which is not in DATABASES.",
                hint="Name one of the aliases of settings.DATABASES.",
                id="django_jobs.E002",
            )
        )
    stale = conf.seconds_or_none(values["STALE_THRESHOLD"])
    heartbeat = conf.seconds_or_none(values["HEARTBEAT_INTERVAL"])
    if stale is not None and heartbeat is not None and stale < 3 * heartbeat:
        messages.append(
            Error(
                f"DJANGO_JOBS['STALE_THRESHOLD'] ({stale:g}s) is less than three "
                f"heartbeats ({heartbeat:g}s each): live workers would be "
                "taken for dead and their runs executed twice.",
                hint="Raise STALE_THRESHOLD to at least 3 times HEARTBEAT_INTERVAL.",
                id="django_jobs.E003",
            )
        )
    if not settings.USE_TZ:
        messages.append(
            Error(
                "django_jobs needs USE_TZ = True: run times and leases are aware datetimes.",
                hint="Set USE_TZ = True in your settings.",
                id="django_jobs.E004",
            )
        )
    return messages


@register()
def check_routers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Check that ``migrate`` may create every django_jobs table in the jobs database."""
    from django.apps import apps

    alias = conf.merged()["DATABASE"]
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return []  # check_settings reports it
    models = list(apps.get_app_config("django_jobs").get_models())
    refused = [m._meta.object_name for m in models if not router.allow_migrate_model(alias, m)]
    if not refused:
        return []
    tables = "tables" if len(refused) == len(models) else f"tables {', '.join(map(str, refused))}"
    return [
        Error(
            f"DATABASE_ROUTERS keep migrate from creating django_jobs' {tables} in the jobs "
            f"database {alias!r}: workers and enqueues would find no table there.",
            hint=f"Let your router's allow_migrate() return True for app_label 'django_jobs' "
            f"on database {alias!r} (DJANGO_JOBS['DATABASE']), then run "
            f"migrate --database {alias}.",
            id="django_jobs.E016",
        )
    ]


@register(Tags.database)
def check_databases(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Check the jobs database can lock rows with SKIP LOCKED (run by migrate and the worker)."""
    alias = conf.get().DATABASE
    if databases is None or alias not in databases or alias not in settings.DATABASES:
        return []
    return check_database(alias)


def check_database(alias: str) -> list[CheckMessage]:
    """Return the messages about database ``alias`` as the jobs database."""
    return database_messages(connections[alias], alias)


def database_messages(connection: Any, alias: str) -> list[CheckMessage]:
    """The messages about ``connection`` (of ``alias``) as the jobs database: an
    error when django_jobs cannot run on it, warnings when it runs with a limit or
    its OPTIONS lack an entry."""
    from .storage import vendors

    vendor = vendors.of(connection)
    reason = vendor.unserved(connection)
    if reason is not None:
        return [
            Error(
                f"The jobs database {alias!r} cannot hold django_jobs' tables: {reason}.",
                hint="Use PostgreSQL, MariaDB 10.6+ or MySQL 8.0.17+ (InnoDB) for the jobs "
                "database (docs/installation.md).",
                id="django_jobs.E005",
            )
        ]
    messages: list[CheckMessage] = []
    limit = vendor.limit(connection)
    if limit is not None:
        messages.append(
            Warning(f"The jobs database {limit}", hint=vendor.limit_hint, id="django_jobs.W001")
        )
    missing = vendor.missing_options(connection)
    if missing is not None:
        problem, entry = missing
        messages.append(
            Warning(
                f"The jobs database {alias!r} {problem}.",
                hint=f"Add {entry} to DATABASES[{alias!r}] (docs/installation.md).",
                id="django_jobs.W002",
            )
        )
    return messages


SCHEDULE_HINTS = {
    "E009": "Give each schedule 'job_type' and 'cron', and optionally 'timezone', 'missed' "
    "('skip' or 'catch_up') and a JSON 'input' (see docs/schedules.md).",
    "E010": "Write five fields (minute hour day-of-month month day-of-week) or a macro "
    "such as '@daily'.",
    "E011": "Use an IANA name such as 'Europe/Paris' or 'UTC' (zoneinfo; on Windows, "
    "install tzdata).",
    "E012": "Name a job type registered with @job in the jobs.py of an installed app, or "
    "the module path of a django.tasks @task (TASKS must use JobsBackend).",
    "E013": "Rename the settings schedule: a @job's schedule is named after its job type.",
}


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``DJANGO_JOBS["SCHEDULES"]`` (``@job`` schedules are checked at import)."""
    if not isinstance(conf.merged()["SCHEDULES"], dict):
        return []  # check_settings reports it; the schedules cannot be read
    from .registry import all_handlers
    from .schedules import other_target, settings_problems

    # Settings are code: a task they name may be imported to be found.
    found = settings_problems(all_handlers(), lambda name: other_target(name, importing=True))
    return [
        Error(message + ".", hint=SCHEDULE_HINTS[code], id=f"django_jobs.{code}")
        for code, message in found
    ]


@register()
def check_rate_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``DJANGO_JOBS["RATE_LIMITS"]`` (``@job`` limits are checked at import)."""
    from .ratelimits import settings_problems

    return [
        Error(
            message + ".",
            hint="Give each pool a rate such as '100/m', '5/s', '1000/h' or '10/30s' "
            "(docs/rate-limits.md).",
            id="django_jobs.E014",
        )
        for message in settings_problems()
    ]


@register()
def check_job_options(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``DJANGO_JOBS["JOB_OPTIONS"]``, importing its dotted paths (settings are code)."""
    from .joboptions import problems

    return [
        Error(
            message + ".",
            hint="Give each job type or pattern a dict of @job's options: pool, priority, "
            "retry, timeout, concurrency_key, concurrency_limit, rate_limit, rate_limit_key "
            "(docs/other-apps.md).",
            id="django_jobs.E015",
        )
        for message in problems()
    ]


@register()
def check_limited_pools(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn of a pool ``RATE_LIMITS`` or ``TENANT_CONCURRENCY`` names that no run is
    sent to: a typo, whose limit applies to nothing."""
    from .pools import any_queue, limited_pools, run_pools

    if any_queue():
        return []  # a task may name any queue: every pool may have runs
    known = run_pools()
    return [
        Warning(
            f"DJANGO_JOBS[{key!r}] names pool {name!r}, which no @job, tasks queue or "
            "JOB_OPTIONS entry sends runs to: it limits no run.",
            hint="Name the pool of the jobs to limit (a typo?). If code starts runs in that "
            "pool with start(..., pool=...), add 'django_jobs.W004' to SILENCED_SYSTEM_CHECKS.",
            id="django_jobs.W004",
        )
        for key, names in limited_pools().items()
        for name in sorted(names - known)
    ]


@register(deploy=True)
def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The checks of ``manage.py check --deploy``: test settings in production."""
    if conf.merged()["RUN_ON_COMMIT"] is not True:
        return []
    return [
        Warning(
            "DJANGO_JOBS['RUN_ON_COMMIT'] is True: every run runs in the process that "
            "starts it, when its transaction commits (a test mode), and runjobworker refuses "
            "to start.",
            hint="Set RUN_ON_COMMIT in the settings of your tests only.",
            id="django_jobs.W003",
        )
    ]


def pool_size(alias: str) -> int | None:
    """The most connections Django's connection pool for ``alias`` lends at once
    (``OPTIONS["pool"]``, PostgreSQL on Django 5.1+), or None without a pool."""
    pool = getattr(connections[alias], "pool", None)
    return None if pool is None else int(pool.max_size)


def connection_limit(alias: str) -> int | None:
    """The connections the jobs database's server accepts (PostgreSQL), else None."""
    from .storage import vendors

    connection = connections[alias]
    return vendors.of(connection).connection_limit(connection)
