"""``Vendor``: the interface of the statements that differ per database, in portable forms.

A method that returns None says "this database has no faster form": the caller
then uses the portable way (the two-statement claim, a write per run, Django's
``bulk_create``), as on SQLite. A database with no vendor module of its own gets
this class as it is, whose ``unserved()`` refuses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from typing import Any

from django.db import NotSupportedError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from ...models import JobRun, JobStep

# Tenant caps in force for a claim: (cap by pool, sorted), and the cap of the others.
Caps = tuple[tuple[tuple[str, int], ...], int | None]


class Vendor:
    """The portable forms; a vendor module overrides what its database does better."""

    # Whether idle workers can be woken by the database (LISTEN/NOTIFY) instead of polling.
    listens = False
    # Seconds between an idle worker's claims when POLL_INTERVAL is not set: short
    # where nothing wakes idle workers.
    poll_interval = 0.2
    # What to do about ``limit()``.
    limit_hint = ""

    def unserved(self, connection: BaseDatabaseWrapper) -> str | None:
        """Why django_jobs cannot run on this database, or None when it can.

        A database without a vendor module is refused: the portable forms alone do
        not say how its rows are locked, nor how a run's attempts are recorded.
        """
        return (
            f"django_jobs does not run on {connection.display_name}; it runs on "
            "PostgreSQL, MariaDB 10.6+, MySQL 8.0.17+, and SQLite with one worker process"
        )

    def limit(self, connection: BaseDatabaseWrapper) -> str | None:
        """What django_jobs cannot do on this database that it does elsewhere, or None."""
        return None

    def missing_options(self, connection: BaseDatabaseWrapper) -> tuple[str, str] | None:
        """What goes wrong without an entry the database's ``OPTIONS`` lack, and the
        entry to add; None when nothing is missing."""
        return None

    def enter_worker(self, connection: BaseDatabaseWrapper) -> Callable[[], None]:
        """Make the database ready for a worker process at its start; return what the
        worker calls at its end. Raise ``WorkerRefused`` when no worker may start."""
        return _nothing

    def prepare(self, connection: BaseDatabaseWrapper) -> None:
        """Set up a worker's connection once it is connected (each new one, every reconnection)."""

    def clock(self, connection: BaseDatabaseWrapper) -> datetime:
        """The database's clock now, as an aware UTC datetime: not the transaction's
        start, where the database has both. (Here: this process's clock, as
        SQLite's is; one process uses it.)"""
        return timezone.now()

    def fetch(
        self, connection: BaseDatabaseWrapper, sql: str, params: list[Any] | dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Execute ``sql`` (``%s`` placeholders, returning rows); return the rows."""
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows

    def claim(
        self,
        connection: BaseDatabaseWrapper,
        key: Hashable,
        picked: Callable[[], Any],
        fields: Sequence[str],
        worker_id: uuid.UUID,
        token: uuid.UUID,
        plan: int,
        *,
        dates: Sequence[str] = (),
        deferring: bool = False,
        caps: Caps | None = None,
    ) -> list[tuple[Any, ...]] | None:
        """Claim the rows ``picked()`` selects (a list of locking, limited querysets
        in claim order, one per pool claimed for: the first of their merge) in one
        statement, which may be kept per ``key`` and ``plan``: rows of ``fields``, then
        whether the run has steps, then whether every one of ``dates`` (fields too)
        is NULL or an instant Python holds; those that are not come back NULL.
        ``deferring``: ``picked()`` has a boolean column ``deferred``; such rows are
        not claimed but come back too, their id alone, and every row ends with
        whether it was deferred. ``caps``: the tenant caps in force (by pool, and
        for the others), under which ``picked()`` has the columns ``pool`` and
        ``tenant_id`` and each claimed run of a capped tenant takes a free slot of
        its tenant's cap (``storage.holds``). None: this database has no
        one-statement claim.

        ``key`` is ``(group, limit)``: the statements of one group (one pool set
        and kind of run) share a ``plan`` number, so a newer one retires the
        group's older statements."""
        return None

    def lock_keys(self, connection: BaseDatabaseWrapper, keys: list[str]) -> set[str]:
        """Of the concurrency ``keys`` a claim wants, those it may take now: at most
        one here, which no two claims can wait on in a cycle."""
        return set(keys[:1])

    def unlock_keys(self, connection: BaseDatabaseWrapper) -> None:
        """Give back the keys ``lock_keys`` took, once the claim's transaction has ended
        (where they outlive it)."""

    def worker_ids(
        self, column: str, params: list[Any], worker_id: str | None
    ) -> tuple[str, list[Any]]:
        """SQL of the JSON array ``column`` with ``worker_id`` appended (None: its last removed)."""
        raise NotSupportedError("django_jobs records attempts only on the databases it serves")

    def complete_many(
        self,
        connection: BaseDatabaseWrapper,
        table: str,
        status: str,
        items: list[tuple[int, uuid.UUID, Any]],
    ) -> set[tuple[int, uuid.UUID]] | None:
        """Complete the runs of ``items`` (id, token, output) in one statement, each
        fenced on its token; the (id, token) pairs written. None: not in one statement."""
        return None

    def record_step(
        self, connection: BaseDatabaseWrapper, params: dict[str, Any], *, completed: bool
    ) -> bool:
        """Insert or update a step's row while its run's lease holds, in one statement."""
        raise NotSupportedError("django_jobs records steps only on the databases it serves")

    def insert_runs(
        self,
        connection: BaseDatabaseWrapper,
        template: JobRun,
        texts: list[str],
        data: list[Any],
        keys: list[str | None],
        rate_keys: list[str | None],
        holds: list[str],
        turns: list[int],
    ) -> list[JobRun] | None:
        """Insert runs that differ only in input, keys, hold and turn in one statement.
        None: no such form."""
        return None

    def last_turn(
        self, connection: BaseDatabaseWrapper, pool: str, priority: int, tenant_id: str | None
    ) -> tuple[str, list[Any]] | None:
        """A query of the highest turn of the tenant's ready runs in ``pool`` at
        ``priority`` (NULL when
        none), where the ORM's would not find it through the turns index. None: the
        ORM's."""
        return None

    def delete(
        self, connection: BaseDatabaseWrapper, table: str, column: str, ids: list[Any]
    ) -> int:
        """Delete the rows of ``table`` whose ``column`` is in ``ids``, in one statement,
        without loading them; return how many."""
        quote = connection.ops.quote_name
        placeholders = ", ".join(["%s"] * len(ids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {quote(table)} WHERE {quote(column)} IN ({placeholders})", ids
            )
            return int(cursor.rowcount)

    def prepare_control(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        """Set up the connection a worker's control threads share (claims among
        them), once per session: row locks waited for at most ``seconds`` (where the
        database can say so per session)."""

    def notify(self, connection: BaseDatabaseWrapper, channel: str, pools: list[str]) -> None:
        """Wake listening workers for ``pools`` at the transaction's commit (where it can)."""

    def estimated_rows(self, connection: BaseDatabaseWrapper, table: str) -> int | None:
        """The planner's estimate of ``table``'s rows, or None where it is not known cheaply."""
        return None

    def connection_limit(self, connection: BaseDatabaseWrapper) -> int | None:
        """How many connections the server accepts, or None where it is not known."""
        return None


def _nothing() -> None:
    pass


def step_statement(*, completed: bool, json: str, started: str, now: str, lock: str) -> str:
    """The statement that records a step, written once for every database with an upsert.

    The row is inserted only while the run is running under this lease; a failed
    step recorded earlier is overwritten (its attempts counted up), a completed
    one never. A vendor fills in its dialect: ``json`` casts a JSON parameter,
    ``started`` and ``now`` are the step's times, ``lock`` keeps the run as it
    is until the transaction ends. The WHERE of the SELECT also keeps SQLite
    from reading ON CONFLICT as part of a join.
    """
    run_table = JobRun._meta.db_table
    step_table = JobStep._meta.db_table
    status = JobStep.StepStatus.COMPLETED if completed else JobStep.StepStatus.FAILED
    output, error = (f"%(output)s{json}", "NULL") if completed else ("NULL", f"%(error)s{json}")
    return f"""
        INSERT INTO {step_table}
            (run_id, step_id, seq, status, attempts, output, error, started_at, finished_at)
        SELECT %(run)s, %(step)s, %(seq)s, '{status}', 1, {output}, {error}, {started}, {now}
        WHERE EXISTS (
            SELECT 1 FROM {run_table}
            WHERE id = %(run)s AND lease_token = %(token)s
            {lock}
        )
        ON CONFLICT (run_id, step_id) DO UPDATE SET
            seq = excluded.seq,
            status = excluded.status,
            attempts = {step_table}.attempts + 1,
            output = excluded.output,
            error = excluded.error,
            started_at = excluded.started_at,
            finished_at = excluded.finished_at
        WHERE {step_table}.status <> 'completed'
        RETURNING 1
    """
