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

from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import conf

# psycopg prepares a statement on its own after this many executions; Django
# disables that (None), and so would ``prepare=True``. A threshold no statement
# reaches turns it back on for ``prepare=True`` only, leaving the ORM's as they were.
_ONLY_WHEN_ASKED = 2**62


def fetch(using: str, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Execute ``sql`` (``%s`` placeholders) on ``using`` and return its rows."""
    connection = connections[using]
    if _can_prepare(connection):
        import psycopg

        connection.ensure_connection()
        raw = connection.connection
        if raw.prepare_threshold is None:
            raw.prepare_threshold = _ONLY_WHEN_ASKED
        with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchall() if cursor.description else []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _can_prepare(connection: BaseDatabaseWrapper) -> bool:
    if connection.vendor != "postgresql" or not conf.get().PREPARED_STATEMENTS:
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)
