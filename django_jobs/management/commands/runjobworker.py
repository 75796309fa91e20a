"""``manage.py runjobworker``: turn flags into a Worker and run it."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobs import conf
from django_jobs.checks import check_database, connection_limit, pool_size
from django_jobs.eventloop import DATABASE_THREADS
from django_jobs.exceptions import WorkerRefused
from django_jobs.logstream import LOGGER, write_worker_log
from django_jobs.management import reload
from django_jobs.management.arguments import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    async_concurrency,
    concurrency,
    pool_name,
    port,
    positive_float,
    positive_int,
)
from django_jobs.management.base import JobsCommand
from django_jobs.management.startup import wait_for_database, warn_of_pools_without_handlers
from django_jobs.registry import all_handlers
from django_jobs.worker import DEFAULT_ASYNC_CONCURRENCY, JobWorker

DEFAULT_START_TIMEOUT = 30.0
logger = logging.getLogger(__name__)
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(JobsCommand):
    help = (
        "Run django_jobs runs of the given pools until stopped (SIGTERM/SIGINT drains). "
        "At start, an unreachable database is retried for --start-timeout seconds; then, "
        "or at once when the django_jobs tables are missing, the command exits with status 1."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--pool",
            dest="pools",
            action="append",
            type=pool_name,
            metavar="NAME",
            help="pool to claim runs from; repeat for several (default: 'default')",
        )
        parser.add_argument(
            "--concurrency",
            type=concurrency,
            default=None,
            metavar="N",
            help=f"runs executed at once, one thread and database connection each, "
            f"1 to {MAX_CONCURRENCY} and at most the server's max_connections (default: "
            f"{DEFAULT_CONCURRENCY}, or what Django's connection pool can serve)",
        )
        parser.add_argument(
            "--async-concurrency",
            type=async_concurrency,
            default=DEFAULT_ASYNC_CONCURRENCY,
            metavar="N",
            help=f"async def runs executed at once on the worker's event loop, sharing "
            f"{DATABASE_THREADS} database connections; 0 runs them in the threads "
            f"(default: {DEFAULT_ASYNC_CONCURRENCY})",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="exit once no due run is left instead of waiting for more",
        )
        parser.add_argument(
            "--max-runs",
            type=positive_int,
            default=None,
            metavar="N",
            help="exit after claiming N runs (and finishing them)",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=None,
            metavar="S",
            help="seconds between claims when idle (default: the POLL_INTERVAL setting, else "
            "1 on PostgreSQL, where NOTIFY wakes idle workers, and 0.2 elsewhere)",
        )
        parser.add_argument(
            "--start-timeout",
            type=positive_float,
            default=DEFAULT_START_TIMEOUT,
            metavar="S",
            help="seconds to keep retrying an unreachable database at start before exiting "
            f"with status 1 (default: {DEFAULT_START_TIMEOUT:g})",
        )
        parser.add_argument(
            "--no-scheduler",
            dest="scheduler",
            action="store_false",
            help="start no runs of periodic schedules here (default: schedule the jobs "
            "of this worker's pools)",
        )

        reloader = parser.add_mutually_exclusive_group()
        reloader.add_argument(
            "--reload",
            dest="use_reloader",
            action="store_true",
            default=None,
            help="start the worker again when code changes, after its running runs finish "
            "(default: on when settings.DEBUG is true, unless --burst or --max-runs)",
        )
        reloader.add_argument(
            "--noreload",
            dest="use_reloader",
            action="store_false",
            help="do not start the worker again when code changes (as runserver's --noreload)",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            default=None,
            metavar="PORT",
            help="serve Prometheus metrics over HTTP on this port (needs the metrics extra)",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help="address the metrics port listens on (default: 127.0.0.1, this machine only)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        if conf.get().RUN_ON_COMMIT:
            raise CommandError(
                "DJANGO_JOBS['RUN_ON_COMMIT'] is True: in this test mode a run runs in the "
                "process that starts it, when its transaction commits, and no worker runs it. "
                "Start runjobworker with settings that leave RUN_ON_COMMIT False."
            )
        reloading = self._reloading(options)
        if reloading and not reload.is_child():
            # The reloader's parent: it runs no worker and touches no database.
            code = reload.Supervisor().run()
            if code:
                sys.exit(code)
            return
        alias = conf.get().DATABASE
        # The command's own system checks ran already; the database ones are not
        # run by default, but a worker must not start on a database django_jobs
        # does not run on. Checked before the tables are: it is said first, and
        # not hidden behind "the tables are missing". A check that must ask the
        # server (MySQL's version) waits for it like the rest of the start.
        try:
            refused = _refusal(alias)
        except DatabaseError:
            wait_for_database(alias, options["start_timeout"])
            refused = _refusal(alias)
        if refused:
            raise CommandError(refused)
        wait_for_database(alias, options["start_timeout"])
        slots, database_threads = self._concurrency(
            options["concurrency"], options["async_concurrency"], alias
        )
        if options["metrics_port"] is not None:
            self._serve_metrics(options["metrics_port"], options["metrics_addr"])
        pools = options["pools"] or ["default"]
        # The tasks JOB_OPTIONS gives a rate limit: found before the worker reads
        # the limits it enforces (without a tasks framework installed, none).
        try:
            from django_jobs.tasks_backend import load_option_targets
        except ImproperlyConfigured:
            pass
        else:
            load_option_targets()
        warn_of_pools_without_handlers(pools)
        worker = JobWorker(
            pools,
            concurrency=slots,
            async_concurrency=options["async_concurrency"],
            database_threads=database_threads,
            burst=options["burst"],
            max_runs=options["max_runs"],
            poll_interval=options["poll_interval"],
            scheduler=options["scheduler"],
            watchman=True,
        )
        watcher = reload.Reloading(worker) if reloading else None
        if watcher is not None:
            watcher.install_signal_handlers()
            watcher.start()
        else:
            worker.install_signal_handlers()
        try:
            code = worker.run()
        except WorkerRefused as exc:
            raise CommandError(str(exc)) from None
        except RuntimeError as exc:
            if "can't start new thread" not in str(exc):
                raise
            raise CommandError(
                f"the worker could not start its threads ({exc}); lower --concurrency ({slots})."
            ) from exc
        if watcher is not None and watcher.restart:
            sys.exit(reload.RESTART)
        if code:
            sys.exit(code)

    def _reloading(self, options: dict[str, Any]) -> bool:
        """Whether to run under the reloader: --reload, --noreload, else settings.DEBUG
        (not for a worker that exits by itself, nor one not started from a shell)."""
        asked = options["use_reloader"]
        ends = options["burst"] or options["max_runs"] is not None
        from_shell = getattr(self, "_called_from_command_line", False)
        if asked is None:
            return bool(settings.DEBUG) and not ends and from_shell
        if asked and ends:
            raise CommandError(
                "--reload cannot be combined with --burst or --max-runs: a worker that "
                "exits by itself has nothing to restart",
                returncode=2,
            )
        if asked and not from_shell:
            raise CommandError(
                "--reload starts this command line again in a new process: run "
                "`manage.py runjobworker --reload` from a shell, not call_command()"
            )
        return bool(asked)

    def _concurrency(self, requested: int | None, async_runs: int, alias: str) -> tuple[int, int]:
        """The slots to run and the event loop's database threads: --concurrency,
        refused when the server or Django's pool cannot serve it; without the flag,
        the default, capped to what they can."""
        limit, size = connection_limit(alias), pool_size(alias)
        # The slots' connections and the control threads' one (storage/control.py) come
        # from Django's pool when there is one; the LISTEN connection does not. Async
        # runs add the event loop's database threads, and Django's sync thread
        # (their ORM calls), once the worker meets one: at least one of each.
        extra = 2 if async_runs and _may_run_async() else 0
        if requested is None:
            requested = default_concurrency(alias, limit, size, extra)
        if limit is not None and requested > limit:
            raise CommandError(
                f"--concurrency {requested} needs at least as many connections "
                f"to the jobs database; its server accepts {limit} (max_connections)."
            )
        needed = requested + 1 + extra
        if size is not None and size < needed:
            who = (
                f"--concurrency {requested} and --async-concurrency {async_runs} need"
                if extra
                else f"--concurrency {requested} needs"
            )
            raise CommandError(
                f"{who} {needed} connections from "
                f"Django's connection pool for database {alias!r}, which lends at most {size}: "
                f"set OPTIONS['pool'] = {{'max_size': {needed}}} or more, or lower --concurrency"
                + (" (or pass --async-concurrency 0)." if extra else ".")
            )
        if size is None or not extra:
            return requested, DATABASE_THREADS
        # What the pool has left after the slots, the control threads and Django's sync thread.
        return requested, min(DATABASE_THREADS, size - requested - 2)

    def _serve_metrics(self, port: int, addr: str) -> None:
        try:
            from django_jobs import metrics
        except ImproperlyConfigured as exc:
            raise CommandError(f"--metrics-port: {exc}") from None
        try:
            metrics.serve(port, addr)
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: cannot listen on {addr!r}: {exc}") from None

    def _configure_logging(self, verbosity: int) -> None:
        """Set django_jobs' level from ``verbosity``; send its lines to stderr, where
        Django's console handler writes, unless the project's LOGGING configured them."""
        logging.getLogger(LOGGER).setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        write_worker_log(sys.stderr)


def default_concurrency(alias: str, limit: int | None, size: int | None, extra: int = 0) -> int:
    """``DEFAULT_CONCURRENCY``, lowered (in one INFO line) to what Django's connection
    pool (which also lends the control threads' connection, and ``extra`` ones for
    async runs) or the server can serve."""
    by_pool = DEFAULT_CONCURRENCY if size is None else max(1, size - 1 - extra)
    by_server = DEFAULT_CONCURRENCY if limit is None else limit
    slots = min(DEFAULT_CONCURRENCY, by_pool, by_server)
    if slots == by_pool < DEFAULT_CONCURRENCY:
        logger.info(
            "concurrency=%d default=%d database=%s pool_max_size=%s: the worker takes "
            "concurrency + %d connections from Django's pool; give the pool more or "
            "pass --concurrency",
            slots,
            DEFAULT_CONCURRENCY,
            alias,
            size,
            1 + extra,
        )
    elif slots < DEFAULT_CONCURRENCY:
        logger.info(
            "concurrency=%d default=%d database=%s max_connections=%s: the server "
            "accepts no more connections",
            slots,
            DEFAULT_CONCURRENCY,
            alias,
            limit,
        )
    return slots


def _may_run_async() -> bool:
    """Whether this worker may meet async runs: an ``async def`` @job, or a
    JobsBackend (a task's kind is known only once its module is imported)."""
    if any(handler.is_async for handler in all_handlers().values()):
        return True
    try:
        from django_jobs.tasks_backend import configured
    except ImproperlyConfigured:  # no tasks framework installed: no JobsBackend either
        return False
    return configured()


def _refusal(alias: str) -> str | None:
    """Why the database checks refuse ``alias`` as the jobs database, or None."""
    problems = [m for m in check_database(alias) if m.is_serious()]
    return "; ".join(f"{m.id}: {m.msg}" for m in problems) or None
