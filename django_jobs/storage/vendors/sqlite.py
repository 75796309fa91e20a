"""SQLite: the portable forms, with SQLite's JSON functions for the attempts' workers.

SQLite serves one worker process, with threads. The worker holds a lock file
beside the database for its lifetime, so a second one is refused at start; it
switches the file to WAL, where readers (a web process, the admin) never wait
for its writes; and its connections begin their transactions IMMEDIATE, taking
the one write lock at BEGIN: a transaction that read first and wrote later
would otherwise fail at once when another connection had written meanwhile,
whatever the busy timeout.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.sqlite3.creation import DatabaseCreation
from django.utils import timezone

from ...exceptions import WorkerRefused
from .base import Vendor, step_statement

if sys.platform != "win32":
    import fcntl

logger = logging.getLogger(__name__)

# Transaction modes that take the write lock at BEGIN.
LOCKING_MODES = frozenset({"IMMEDIATE", "EXCLUSIVE"})
LOCK_SUFFIX = ".django_jobs-worker.lock"


class SQLite(Vendor):
    limit_hint = (
        "Run more threads with runjobworker --concurrency, or use PostgreSQL or MariaDB "
        "for more than one worker process."
    )

    def unserved(self, connection: BaseDatabaseWrapper) -> str | None:
        return None

    def limit(self, connection: BaseDatabaseWrapper) -> str | None:
        if _in_memory(connection):
            # Each connection has its own: no worker process can share it (a test
            # database, whose runs drain() or RUN_ON_COMMIT runs in-process).
            return None
        if sys.platform == "win32":
            return "is SQLite, which serves one worker process (threads are fine): start one only."
        return (
            "is SQLite, which serves one worker process (threads are fine): a second "
            "runjobworker on the same database file is refused at start."
        )

    def missing_options(self, connection: BaseDatabaseWrapper) -> tuple[str, str] | None:
        if _in_memory(connection) or _transaction_mode(connection) in LOCKING_MODES:
            return None
        return (
            "begins transactions DEFERRED: a transaction that reads, then writes, fails "
            'with "database is locked" when another connection wrote meanwhile (the '
            "worker begins its own IMMEDIATE; your web process, shell and admin do not)",
            '"OPTIONS": {"transaction_mode": "IMMEDIATE"}',
        )

    def enter_worker(self, connection: BaseDatabaseWrapper) -> Callable[[], None]:
        """Take the database's worker lock, then switch it to WAL (unless the project
        chose its journal mode); an in-memory database needs neither."""
        path = _database_file(connection)
        if path is None:
            return super().enter_worker(connection)
        release = _lock(path)
        try:
            _use_wal(connection, path)
        except BaseException:
            release()
            raise
        if _transaction_mode(connection) is None:
            logger.info(
                "database=%s transaction_mode=IMMEDIATE in this worker (OPTIONS set none; "
                "see check django_jobs.W002)",
                path,
            )
        return release

    def prepare(self, connection: BaseDatabaseWrapper) -> None:
        # What OPTIONS say is kept; unset, IMMEDIATE (Django reads it at each BEGIN).
        if getattr(connection, "transaction_mode", None) is None:
            connection.transaction_mode = "IMMEDIATE"  # type: ignore[attr-defined]

    def worker_ids(
        self, column: str, params: list[Any], worker_id: str | None
    ) -> tuple[str, list[Any]]:
        if worker_id is None:
            return f"json_remove({column}, '$[#-1]')", params
        return f"json_insert({column}, '$[#]', %s)", [*params, worker_id]

    def record_step(
        self, connection: BaseDatabaseWrapper, params: dict[str, Any], *, completed: bool
    ) -> bool:
        """The step's row, written only while the run is running under this lease.

        SQLite has no row locks: one writer at a time holds the whole database, so
        the check and the write of one statement cannot be separated by a rescue.
        """
        ops = connection.ops
        now = timezone.now()
        started = params["started"]
        values = {
            **params,
            # SQLite stores a UUID as its 32 hex digits and a datetime as text.
            "token": params["token"].hex,
            "started": ops.adapt_datetimefield_value(
                now if started is None else datetime.fromtimestamp(started, UTC)
            ),
            "now": ops.adapt_datetimefield_value(now),
        }
        with connection.cursor() as cursor:
            cursor.execute(_step_statement(completed=completed), values)
            return cursor.fetchone() is not None


@functools.cache
def _step_statement(*, completed: bool) -> str:
    # No row locks on SQLite: its one writer at a time keeps the run as it is.
    return step_statement(
        completed=completed, json="", started="%(started)s", now="%(now)s", lock=""
    )


def _in_memory(connection: BaseDatabaseWrapper) -> bool:
    return DatabaseCreation.is_in_memory_db(connection.settings_dict["NAME"])


def _transaction_mode(connection: BaseDatabaseWrapper) -> str | None:
    mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
    return None if mode is None else str(mode).upper()


def _database_file(connection: BaseDatabaseWrapper) -> str | None:
    """The real path of the database's file, or None when it has none (in memory)."""
    if _in_memory(connection):
        return None
    # SQLite's own answer: relative names, file: URIs and links all resolved alike.
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA database_list")
        files = {name: file for _, name, file in cursor.fetchall()}
    return os.path.realpath(files["main"]) if files.get("main") else None


def _lock(database: str) -> Callable[[], None]:
    """Lock ``database`` for this worker process; return what unlocks it.

    An exclusive ``flock`` on a file beside the database, which the operating
    system releases when the process ends, however it ends. The holder's pid is
    written in it, for the message of a worker refused.
    """
    if sys.platform == "win32":
        return lambda: None  # no flock: nothing stops a second worker there
    path = database + LOCK_SUFFIX
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise WorkerRefused(f"cannot create the worker lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 20).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise WorkerRefused(
                f"another django_jobs worker{pid} is running on SQLite database {database}; "
                "SQLite serves one worker process: run more threads with --concurrency, "
                "or use PostgreSQL or MariaDB for more processes"
            ) from None
        if _is_file(fd, path):
            break
        # A worker stopping removed the file between our open and lock: lock the new one.
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())

    def unlock() -> None:
        # Removed while still locked: a worker opening it meanwhile sees it gone.
        with suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)

    return unlock


def _is_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is the file ``path`` names now."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _use_wal(connection: BaseDatabaseWrapper, path: str) -> None:
    """Switch the database to WAL: it stays so in the file, for every process."""
    init = str((connection.settings_dict.get("OPTIONS") or {}).get("init_command", ""))
    if "journal_mode" in init.lower():
        return
    before = "unknown"
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            (before,) = cursor.fetchone()
            if str(before).lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode=WAL")
            (after,) = cursor.fetchone()
    except DatabaseError as exc:
        logger.warning("database=%s journal_mode=%s not changed to WAL: %s", path, before, exc)
        return
    logger.info("database=%s journal_mode=%s (was %s)", path, after, before)
