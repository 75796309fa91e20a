"""Running due runs in this process: ``testing.drain()`` and the test mode.

``drain_due()`` claims and executes due runs one after another, as a worker
would, until none is due. It is ``testing.drain()``'s body.

The test mode (``DJANGO_JOBS["RUN_ON_COMMIT"] = True``) calls it for the caller:
every write that makes runs due (``start``, ``start_many``, ``retry``,
``run_now``, ``cancel``, ``send_event``, and the tasks backend's ``enqueue``)
ends with ``made_due()``, which drains

* at once when the jobs database is in no transaction of the caller's (in
  autocommit, or only inside the transactions a ``TestCase`` wraps each test in,
  which never commit);
* otherwise when the caller's outermost transaction commits: at the commit
  (``transaction.on_commit``), or, inside a ``TestCase``, when that block exits
  without an error (its savepoint released: as far as a commit ever goes there).
  A block that rolls back takes its runs and their drain with it.

Runs made due while a drain runs (children a handler spawns, a parent its last
child wakes) are taken by that drain's next claim, never by a drain nested in a
handler. Afterwards the caller's ``JobRun`` objects hold the rows as the drain
left them: ``start(...).status`` is ``"completed"`` or ``"failed"``, and
``run.wait()`` returns the output or raises the run's error.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import connections, transaction

from . import conf, transitions
from .execution import execute
from .models import JobRun
from .storage import holds, rateholds, turns, workers
from .storage.claiming import claim_batch

# Set while this context drains (or defers its drains, ``deferred()``): runs
# made due meanwhile are left to that drain.
_draining: ContextVar[bool] = ContextVar("django_jobs_draining", default=False)
_deferred: ContextVar[list[JobRun] | None] = ContextVar("django_jobs_deferred", default=None)


def drain_due(pools: list[str] | None = None, *, batch_size: int = 100) -> int:
    """Run due runs of ``pools`` (None: all) here until none is due; return how many ran."""
    worker = workers.register_worker(f"{socket.gethostname()} (drain)", os.getpid(), pools, 1)
    ran = 0
    token = _draining.set(True)
    try:
        while True:
            # Sleeps that are over are woken first, as a worker's watchdog would.
            transitions.wake_sleepers()
            turns.give_turns(pools)
            # No rate limit is enforced here: runs held for a window are ready.
            rateholds.release_all(pools)
            batch = claim_batch(worker.pk, pools, batch_size)
            # Runs held for a concurrency key are released after the commit that
            # freed it, which a test's transaction may never reach: here, at once.
            if not batch and not holds.release_stranded():
                break
            for claim in batch:
                execute(claim)
                ran += 1
    finally:
        _draining.reset(token)
        workers.stop_worker(worker.pk)
    if pools is not None and conf.get().RUN_ON_COMMIT and not _draining.get():
        # The test mode left what the handlers made due to this drain, which
        # took one pool's runs only: the others now.
        ran += drain_due(None, batch_size=batch_size)
    return ran


def made_due(runs: Iterable[JobRun] = ()) -> None:
    """In test mode, drain once the caller's transaction commits (see the module's doc);
    ``runs`` (the caller's objects) are refreshed from their rows afterwards."""
    if not conf.get().RUN_ON_COMMIT or _draining.get():
        return
    runs = list(runs)
    deferred = _deferred.get()
    if deferred is not None:
        deferred.extend(runs)
        return
    connection = connections[conf.get().DATABASE]
    blocks = connection.atomic_blocks if connection.in_atomic_block else []
    # The caller's outermost block: the first above the TestCase's own (none
    # of which commits, nor does a block a fixture opened below them).
    tests = [n for n, block in enumerate(blocks) if getattr(block, "_from_testcase", False)]
    first = (tests[-1] + 1 if tests else 0) if blocks else None
    if first is not None and first >= len(blocks):
        first = None
    if first is None:
        # In no transaction of the caller's: in autocommit, inside a test's own
        # transaction, or in a transaction managed by hand (no on_commit there).
        _drain_and_refresh(runs)
        return
    if first is not None and first > 0:
        # Inside a TestCase, whose own transaction never commits: the caller's
        # outermost block stands for the commit when it exits without an error.
        # Every block but the one that began the transaction made a savepoint
        # (None for atomic(savepoint=False): no exit to wait for, the runs are
        # drained at once).
        sid = connection.savepoint_ids[first - (len(blocks) - len(connection.savepoint_ids))]
        if sid is None:
            _drain_and_refresh(runs)
            return
        _watch(connection, sid)
    transaction.on_commit(_AfterCommit(runs), using=connection.alias)


@contextmanager
def deferred() -> Iterator[None]:
    """Make the drains of test mode wait for the end of this block (the tasks backend
    sends ``task_enqueued`` first, as Django's immediate backend does)."""
    if _deferred.get() is not None or _draining.get():
        yield
        return
    runs: list[JobRun] = []
    token = _deferred.set(runs)
    try:
        yield
    finally:
        _deferred.reset(token)
    if runs:
        made_due(runs)


class _AfterCommit:
    """The drain registered with ``on_commit``: a class, so a watched block finds its own."""

    def __init__(self, runs: list[JobRun]) -> None:
        self.runs = runs
        self.done = False

    def __call__(self) -> None:
        # Once: a captureOnCommitCallbacks(execute=True) inside the watched block
        # runs it and leaves it in the list, which the block's exit runs.
        if not self.done:
            self.done = True
            _drain_and_refresh(self.runs)


def _drain_and_refresh(runs: list[JobRun]) -> None:
    drain_due()
    _refresh(runs)


def _refresh(runs: list[JobRun]) -> None:
    """Give the caller's ``runs`` their rows' values (one query)."""
    if not runs:
        return
    rows = JobRun.objects.using(conf.get().DATABASE).in_bulk([run.pk for run in runs])
    names = [field.attname for field in JobRun._meta.concrete_fields]
    for run in runs:
        row = rows.get(run.pk)
        if row is not None:
            for name in names:
                setattr(run, name, getattr(row, name))


def _watch(connection: Any, sid: str) -> None:
    """Run the ``_AfterCommit`` callbacks registered inside the block of savepoint
    ``sid`` when that block exits without an error (its savepoint released), as a
    commit would: ``connection``'s savepoint methods are wrapped until then."""
    if getattr(connection, "_django_jobs_watched", None) == sid:
        return
    kind = type(connection)

    def unwatch() -> None:
        for name in ("savepoint_commit", "savepoint_rollback", "_django_jobs_watched"):
            connection.__dict__.pop(name, None)

    def savepoint_commit(released: str) -> None:
        kind.savepoint_commit(connection, released)
        if released == sid:
            unwatch()
            _run_callbacks(connection)

    def savepoint_rollback(rolled_back: str) -> None:
        if rolled_back == sid:
            # The block failed: Django drops its callbacks, and then releases
            # the savepoint it rolled back to, which is no commit.
            unwatch()
        kind.savepoint_rollback(connection, rolled_back)

    connection.savepoint_commit = savepoint_commit
    connection.savepoint_rollback = savepoint_rollback
    connection._django_jobs_watched = sid


def _run_callbacks(connection: Any) -> None:
    """Take this module's callbacks out of ``connection``'s pending ``on_commit`` list
    and run them (the ones a rollback did not discard)."""
    ours: list[Callable[[], None]] = [
        func for _, func, _ in connection.run_on_commit if isinstance(func, _AfterCommit)
    ]
    connection.run_on_commit = [
        entry for entry in connection.run_on_commit if not isinstance(entry[1], _AfterCommit)
    ]
    for func in ours:
        func()
