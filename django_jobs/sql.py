"""The worker's hot statements, sent as server-side prepared statements on PostgreSQL.

Django's psycopg backend binds parameters on the client and prepares nothing,
so the server plans every claim again; planning is a third to a half of a
small claim's cost. These few statements (claim, batched completion, step
record) go through a server-side-binding cursor on Django's own connection,
prepared on first use: same connection, same transaction, planned once per
connection. ``PREPARED_STATEMENTS = False`` turns this off (PgBouncer in
transaction mode before 1.21 cannot route prepared statements).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import conf

# psycopg prepares a statement on its own after this many executions; Django
# disables that (None), and so would ``prepare=True``. A threshold no statement
# reaches turns it back on for ``prepare=True`` only, leaving the ORM's as they were.
_ONLY_WHEN_ASKED = 2**62


def fetch(using: str, sql: str, params: list[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
    """Execute ``sql`` (``%s`` placeholders, returning rows) on ``using``; return the rows."""
    connection = connections[using]
    if _can_prepare(connection):
        if connection.connection is None:
            connection.ensure_connection()
        with connection.wrap_database_errors:
            cursor = _cursor(connection)
            cursor.execute(sql, params, prepare=True)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        return rows


def _can_prepare(connection: BaseDatabaseWrapper) -> bool:
    if connection.vendor != "postgresql" or not conf.get().PREPARED_STATEMENTS:
        return False
    return _psycopg3()


@functools.cache
def _psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def _cursor(connection: BaseDatabaseWrapper) -> Any:
    """This connection's server-side-binding cursor, made once per database session."""
    raw = connection.connection
    cursor = getattr(connection, "_django_jobs_cursor", None)
    if cursor is None or cursor.connection is not raw or cursor.closed:
        import psycopg
        from psycopg.types.datetime import TimestamptzLoader

        if raw.prepare_threshold is None:
            raw.prepare_threshold = _ONLY_WHEN_ASKED
        cursor = psycopg.Cursor(raw)
        # psycopg's own loader (in C with psycopg-binary) rather than Django's
        # Python one; both give aware datetimes in the session's time zone (UTC).
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        connection._django_jobs_cursor = cursor  # type: ignore[attr-defined]
    return cursor
