"""``manage.py jobhealth``: exit 0 when healthy, else 1 with the reason in one line.

For orchestrators' probes (Kubernetes, a Dockerfile's HEALTHCHECK): readiness
is "the database answers and every migration is applied", liveness is "a
worker on this host sent a heartbeat lately"; without a flag, both.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections

from django_jobs import conf
from django_jobs.health import Beat, default_max_age, newest_beat, unapplied_migrations
from django_jobs.management.arguments import pool_name, positive_float, positive_int
from django_jobs.management.base import JobsCommand, first_line, missing_tables, where
from django_jobs.payloads import terminal_safe

# Migrations named in the reason at most; the count says how many more.
NAMED_MIGRATIONS = 3


def hostname(value: str) -> str:
    """``--hostname``: 1-255 printable characters without whitespace, as hostnames are."""
    if not 1 <= len(value) <= 255 or not value.isprintable() or any(c.isspace() for c in value):
        raise argparse.ArgumentTypeError(
            f"expected a hostname (1-255 characters, no whitespace), got {value!r}"
        )
    return value


def database_alias(value: str) -> str:
    """``--database``: an alias of ``settings.DATABASES``."""
    if value not in connections.settings:
        known = ", ".join(sorted(connections.settings))
        raise argparse.ArgumentTypeError(
            f"expected a database alias of DATABASES ({known}), got {value!r}"
        )
    return value


class Command(JobsCommand):
    help = (
        "Exit 0 when the database answers, no migration is pending and a worker on this "
        "host sent a heartbeat within --max-age seconds; otherwise exit 1 with the reason "
        "in one line. --readiness checks only the database and migrations, --liveness "
        "only the heartbeat."
    )
    # Django's system checks print a block of lines; the probe checks only what it
    # reads (its settings), and says it in one line.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        kind = parser.add_mutually_exclusive_group()
        kind.add_argument(
            "--readiness",
            action="store_true",
            help="only check that the database answers and every migration is applied",
        )
        kind.add_argument(
            "--liveness",
            action="store_true",
            help="only check that a worker on this host sent a recent heartbeat "
            "(pending migrations do not fail it: a restart would not apply them)",
        )
        parser.add_argument(
            "--pool",
            dest="pools",
            action="append",
            type=pool_name,
            default=[],
            metavar="NAME",
            help="the worker must serve this pool; repeat for several",
        )
        parser.add_argument(
            "--hostname",
            type=hostname,
            default=None,
            metavar="NAME",
            help="the worker's host as it registered (default: this host's name, "
            "a pod's name in Kubernetes)",
        )
        parser.add_argument(
            "--pid",
            type=positive_int,
            default=None,
            metavar="PID",
            help="the worker must be this process (default: any worker of the host)",
        )
        parser.add_argument(
            "--max-age",
            type=positive_float,
            default=None,
            metavar="SECONDS",
            help="the oldest heartbeat that passes (default: 3 x HEARTBEAT_INTERVAL, "
            "at most STALE_THRESHOLD)",
        )
        parser.add_argument(
            "--database",
            type=database_alias,
            default=None,
            metavar="ALIAS",
            help="the database whose migrations are checked (default: the jobs "
            "database, DJANGO_JOBS['DATABASE']); worker rows are read from the jobs database",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        problems = conf.problems()
        if problems:
            raise CommandError(terminal_safe("settings.DJANGO_JOBS: " + "; ".join(problems)))
        jobs = conf.get().DATABASE
        if jobs not in connections.settings:
            raise CommandError(f"DJANGO_JOBS['DATABASE'] {jobs!r} is not an alias of DATABASES")
        alias = options["database"] or jobs
        said = []
        if not options["liveness"]:
            try:
                said.append(self._readiness(alias))
            except DatabaseError as exc:
                raise CommandError(_database_problem(exc, alias)) from exc
        if not options["readiness"]:
            try:
                said.append(self._liveness(options))
            except DatabaseError as exc:
                raise CommandError(_database_problem(exc, jobs)) from exc
        if options["verbosity"] >= 1:
            self.stdout.write(terminal_safe("healthy: " + "; ".join(said)))

    def _readiness(self, alias: str) -> str:
        pending = unapplied_migrations(alias)
        if pending:
            named = ", ".join(pending[:NAMED_MIGRATIONS])
            more = len(pending) - NAMED_MIGRATIONS
            named += f" and {more} more" if more > 0 else ""
            raise CommandError(
                f"{len(pending)} migration(s) not applied on database {where(alias)}: "
                f"{named}; run `manage.py migrate`"
            )
        return f"database {alias!r} migrated"

    def _liveness(self, options: dict[str, Any]) -> str:
        host = options["hostname"] or socket.gethostname()
        max_age = options["max_age"] or default_max_age()
        beat = newest_beat(host, pid=options["pid"], pools=options["pools"])
        if beat is None:
            raise CommandError(terminal_safe(f"no live worker{_which(host, options)}"))
        seconds = beat.age.total_seconds()
        if seconds > max_age:
            raise CommandError(
                terminal_safe(
                    f"{_name(beat)} last sent a heartbeat {seconds:.1f}s ago, more than "
                    f"{max_age:g}s (--max-age)"
                )
            )
        return terminal_safe(f"{_name(beat)} sent a heartbeat {seconds:.1f}s ago")


def _which(host: str, options: dict[str, Any]) -> str:
    """The worker looked for, as the reason names it."""
    text = f" on host {host!r}"
    if options["pid"] is not None:
        text += f" with pid {options['pid']}"
    if options["pools"]:
        text += " serving pool " + ", ".join(options["pools"])
    return text


def _name(beat: Beat) -> str:
    return f"worker {beat.hostname}:{beat.pid} ({beat.status})"


def _database_problem(exc: DatabaseError, alias: str) -> str:
    """A database the probe cannot use, in one line."""
    if missing_tables(exc):
        return terminal_safe(
            f"the django_jobs tables are missing in database {where(alias)}: "
            f"{first_line(exc)}; run `manage.py migrate`"
        )
    return terminal_safe(f"cannot use database {where(alias)}: {first_line(exc)}")
