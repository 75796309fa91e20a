"""Callers that wait for runs: ``JobRun.wait()`` and ``await JobRun.await_result()``.

On PostgreSQL (with ``LISTEN_NOTIFY`` and psycopg 3) the caller opens a
connection of its own for the wait: it LISTENs on ``django_jobs_finished``,
marks the run ``awaited`` (migration 0016's trigger then notifies when it ends,
whichever statement ends it) and reads the run's status there, in autocommit,
so that the wait neither holds a lock in the caller's transaction nor reads
through its snapshot. It also reads the status every ``_RECHECK`` seconds, in
case a notification does not come (a pooler that drops it). Elsewhere the
caller polls the run on its own connection, every 10 ms at first, then less
often, up to every ``_LONGEST_POLL`` seconds.

A run already finished is read on the caller's connection first (one a test
ran with ``drain()`` in its own transaction); inside a transaction, a wait for a
run that has not finished is refused, since the transaction may hold it back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from . import conf
from .api import _refuse_event_loop
from .exceptions import (
    RunCanceled,
    RunError,
    RunFailed,
    RunNotFound,
    RunTimedOut,
    WaitTimeout,
)
from .models import FINISHED_STATUSES, JobRun, Status
from .storage import vendors
from .storage.notify import raw_connection_params
from .storage.reading import decoded

CHANNEL = "django_jobs_finished"
_RECHECK = 1.0  # seconds between reads of a listened run's status
_FIRST_POLL, _LONGEST_POLL = 0.01, 0.25  # seconds between polls without LISTEN

# The run whose handler runs in this context (set by ``execution``): a handler
# that blocked on a run would hold its slot for as long.
current_run: ContextVar[int | None] = ContextVar("django_jobs_current_run", default=None)

_ERRORS: dict[str, type[RunError]] = {
    Status.FAILED: RunFailed,
    Status.TIMED_OUT: RunTimedOut,
    Status.CANCELED: RunCanceled,
}


def wait_for_result(run: JobRun, timeout: float | timedelta | None) -> Any:
    """``JobRun.wait``: the run's output once it has finished (see the model)."""
    _refuse_event_loop("JobRun.wait", instead="await run.await_result(...)")
    _refuse_in_handler("wait")
    deadline = _deadline(timeout)
    row = _read(run.pk)  # on the caller's connection: a run it finished itself (drain())
    if row is not None:
        return _outcome(run, row)
    _refuse_in_transaction(run)
    with _watcher(run.pk) as watcher:
        pause = _FIRST_POLL
        while (row := watcher.read()) is None:
            left = _left(run, deadline, timeout)
            if watcher.listens:
                watcher.hear(min(left, _RECHECK))
            else:
                time.sleep(min(pause, left))
                pause = min(pause * 2, _LONGEST_POLL)
    return _outcome(run, row)


async def await_result(run: JobRun, timeout: float | timedelta | None) -> Any:
    """``JobRun.await_result``: ``wait`` for async code, without blocking the loop."""
    _refuse_in_handler("await_result")
    deadline = _deadline(timeout)
    row = await sync_to_async(_read, thread_sensitive=True)(run.pk)
    if row is not None:
        return _outcome(run, row)
    await sync_to_async(_refuse_in_transaction, thread_sensitive=True)(run)
    if _listening():
        return await _await_listening(run, deadline, timeout)
    pause = _FIRST_POLL
    while True:
        row = await sync_to_async(_read, thread_sensitive=True)(run.pk)
        if row is not None:
            return _outcome(run, row)
        left = _left(run, deadline, timeout)
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_POLL)


async def _await_listening(run: JobRun, deadline: float | None, timeout: Any) -> Any:
    import psycopg

    async with await psycopg.AsyncConnection.connect(
        **raw_connection_params(), autocommit=True
    ) as connection:
        await connection.execute(f"LISTEN {CHANNEL}")
        await connection.execute(_LOCK_TIMEOUT)
        marked = False
        while True:
            if not marked:
                try:
                    await connection.execute(_MARK, [run.pk])
                    marked = True
                except psycopg.errors.LockNotAvailable:
                    pass  # another transaction holds the run: read it again soon
            cursor = await connection.execute(_READ, [run.pk])
            row = _finished(await cursor.fetchone(), run.pk)
            if row is not None:
                return _outcome(run, row)
            left = _left(run, deadline, timeout)
            async for note in connection.notifies(timeout=min(left, _RECHECK)):
                if note.payload == str(run.pk):
                    break


# --- the wait's connection ---------------------------------------------------------------

# The mark waits this long at most for a lock another transaction holds on the run.
_LOCK_TIMEOUT = "SET lock_timeout = '200ms'"
_MARK = f"UPDATE {JobRun._meta.db_table} SET awaited = TRUE WHERE id = %s AND NOT awaited"
_READ = (
    f"SELECT status, output::text, error::text, cancel_reason "
    f"FROM {JobRun._meta.db_table} WHERE id = %s"
)


def _listening() -> bool:
    settings = conf.get()
    if not settings.LISTEN_NOTIFY or not vendors.of_alias(settings.DATABASE).listens:
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


class _Watcher:
    """Reads a run, on a listening connection of its own or on the caller's."""

    def __init__(self, run_id: int, connection: Any = None) -> None:
        self.run_id = run_id
        self.connection = connection
        self.listens = connection is not None
        self.marked = False

    def read(self) -> tuple[Any, ...] | None:
        """The run's row once it has finished, else None (marking the run awaited
        first, until that is done: a lock another transaction holds on the run
        delays the mark, never the wait)."""
        if self.connection is None:
            return _read(self.run_id)
        import psycopg

        if not self.marked:
            try:
                self.connection.execute(_MARK, [self.run_id])
                self.marked = True
            except psycopg.errors.LockNotAvailable:
                pass
        return _finished(self.connection.execute(_READ, [self.run_id]).fetchone(), self.run_id)

    def hear(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the notification that this run ended (other
        awaited runs' are passed over)."""
        for note in self.connection.notifies(timeout=max(seconds, 0.0)):
            if note.payload == str(self.run_id):
                break


@contextmanager
def _watcher(run_id: int) -> Iterator[_Watcher]:
    if not _listening():
        yield _Watcher(run_id)
        return
    import psycopg

    with psycopg.connect(**raw_connection_params(), autocommit=True) as connection:
        connection.execute(f"LISTEN {CHANNEL}")
        connection.execute(_LOCK_TIMEOUT)
        yield _Watcher(run_id, connection)


def _read(run_id: int) -> tuple[Any, ...] | None:
    """The run's status, output, error and cancel reason once it has finished, on the
    caller's own connection; None before."""
    from django.db.models import F, TextField
    from django.db.models.functions import Cast

    row = (
        JobRun.objects.using(conf.get().DATABASE)
        .filter(pk=run_id)
        .values_list(
            "status",
            Cast(F("output"), TextField()),
            Cast(F("error"), TextField()),
            "cancel_reason",
        )
        .first()
    )
    return _finished(row, run_id)


def _finished(row: Any, run_id: int) -> tuple[Any, ...] | None:
    if row is None:
        raise RunNotFound(f"no run with id {run_id} (deleted while it was waited for?)")
    return tuple(row) if row[0] in FINISHED_STATUSES else None


# --- outcomes ----------------------------------------------------------------------------


def _outcome(run: JobRun, row: tuple[Any, ...]) -> Any:
    """The run's output, or its error raised; the instance ``run`` is updated."""
    status, output_text, error_text, reason = row
    run.status = status
    if status == Status.COMPLETED:
        run.output = decoded(output_text)
        return run.output
    error = decoded(error_text)
    run.error = error
    if status == Status.CANCELED:
        message = f"run {run.pk} was canceled" + (f": {reason}" if reason else "")
    else:
        said = error.get("message") if isinstance(error, dict) else None
        message = f"run {run.pk} ended {status}" + (f": {said}" if said else "")
    raise _ERRORS[status](message, run.pk, error)


def _deadline(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    seconds = conf.to_seconds(timeout)
    if seconds < 0:
        raise ValueError(f"timeout must not be negative, got {seconds:g}s")
    return time.monotonic() + seconds


def _left(run: JobRun, deadline: float | None, timeout: Any) -> float:
    """Seconds left before ``deadline`` (a long while without one); raises
    ``WaitTimeout`` when none are."""
    if deadline is None:
        return 3600.0
    left = deadline - time.monotonic()
    if left <= 0:
        seconds = conf.to_seconds(timeout)
        raise WaitTimeout(f"run {run.pk} has not finished after {seconds:g}s")
    return left


def _refuse_in_transaction(run: JobRun) -> None:
    """Refuse to wait inside a transaction of the jobs database for a run that has
    not finished: the run may be one the transaction started (no worker sees it
    before the commit) or changed (locked until the commit), and a wait that
    blocks the commit would never end."""
    if connections[conf.get().DATABASE].in_atomic_block:
        raise RuntimeError(
            f"run.wait() inside transaction.atomic() (or ATOMIC_REQUESTS) for run {run.pk}, "
            "which has not finished: a run its transaction started or changed cannot "
            "finish before it commits. Wait after the commit (transaction.on_commit, or "
            "@transaction.non_atomic_requests on the view)."
        )


def _refuse_in_handler(name: str) -> None:
    running = current_run.get()
    if running is not None:
        raise RuntimeError(
            f"run.{name}() was called inside the handler of run {running}, where it would "
            f"hold its worker slot while it waits: a handler waits for its child runs "
            f"durably with ctx.wait_for() (await ctx.await_for() in async def handlers)"
        )
