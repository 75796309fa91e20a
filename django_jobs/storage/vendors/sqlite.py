"""SQLite: the portable forms, with SQLite's JSON functions for the attempts' workers."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .base import Vendor, step_statement


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
    # No row locks on SQLite: its one writer at a time keeps the run as it is.
    return step_statement(
        completed=completed, json="", started="%(started)s", now="%(now)s", lock=""
    )
