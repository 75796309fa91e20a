"""SQLite: the portable forms, with SQLite's JSON functions for the attempts' workers."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from ...models import JobRun, JobStep
from .base import Vendor


class SQLite(Vendor):
    limit_hint = "Use PostgreSQL for more than one worker process."

    def unserved(self, connection: BaseDatabaseWrapper) -> str | None:
        return None

    def limit(self, connection: BaseDatabaseWrapper) -> str | None:
        return (
            "is SQLite, which has no row locks: run one worker process only (threads "
            "are fine), or runs may execute twice."
        )

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
    run_table = JobRun._meta.db_table
    step_table = JobStep._meta.db_table
    status = JobStep.StepStatus.COMPLETED if completed else JobStep.StepStatus.FAILED
    output, error = ("%(output)s", "NULL") if completed else ("NULL", "%(error)s")
    # The WHERE of the SELECT also keeps SQLite from reading ON CONFLICT as a join.
    return f"""
        INSERT INTO {step_table}
            (run_id, step_id, seq, status, attempts, output, error, started_at, finished_at)
        SELECT %(run)s, %(step)s, %(seq)s, '{status}', 1, {output}, {error},
            %(started)s, %(now)s
        WHERE EXISTS (
            SELECT 1 FROM {run_table} WHERE id = %(run)s AND lease_token = %(token)s
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
