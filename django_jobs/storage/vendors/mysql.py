"""MySQL 8 and MariaDB 10.6+: the two-statement claim, JSON functions, a step upsert.

Both have ``SKIP LOCKED`` (MySQL 8.0.1, MariaDB 10.6), which the claim needs.
Neither has ``UPDATE ... RETURNING``, partial indexes nor LISTEN: runs are
claimed in several statements (``claiming.claim_two_statements``), the keys'
unique indexes are over generated columns (migration 0002), and idle workers poll.

Where the two differ, the difference is here: MariaDB has ``INSERT ...
RETURNING`` (so Django's ``bulk_create`` returns the new ids) and MySQL has
not; MySQL has ``FOR SHARE`` and MariaDB only its older spelling, ``LOCK IN
SHARE MODE``, which both accept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import uuid
from copy import copy
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from ...models import JobRun, JobStep
from .base import Vendor

# The oldest servers with SKIP LOCKED and a binary NO PAD collation (migration 0002).
MARIADB_OLDEST = (10, 6)
MYSQL_OLDEST = (8, 0, 17)


class MySQL(Vendor):
    def unserved(self, connection: BaseDatabaseWrapper) -> str | None:
        mariadb = connection.mysql_is_mariadb  # type: ignore[attr-defined]
        version = tuple(connection.mysql_version)  # type: ignore[attr-defined]
        name = "MariaDB" if mariadb else "MySQL"
        oldest = MARIADB_OLDEST if mariadb else MYSQL_OLDEST
        if version < oldest:
            shown = ".".join(map(str, version))
            return (
                f"{name} {shown} is too old; django_jobs needs {name} "
                f"{'.'.join(map(str, oldest))} or later (SKIP LOCKED, a binary NO PAD collation)"
            )
        engine = connection.features._mysql_storage_engine  # type: ignore[attr-defined]
        if engine != "InnoDB":
            return f"its tables are created with {engine}, which has no row locks; use InnoDB"
        if settings.USE_TZ and _clock_offset(connection):
            return (
                "the connection's time zone is not UTC, so the database's clock and "
                "Django's times disagree; add OPTIONS "
                "{'init_command': \"SET time_zone = '+00:00'\"} to the database's settings"
            )
        return None

    def clock(self, connection: BaseDatabaseWrapper) -> datetime:
        # UTC_TIMESTAMP, not NOW(): the session's time zone need not be UTC.
        with connection.cursor() as cursor:
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            (now,) = cursor.fetchone()
        return now.replace(tzinfo=UTC)  # type: ignore[no-any-return]

    def lock_keys(self, connection: BaseDatabaseWrapper, keys: list[str]) -> set[str]:
        """The keys whose named lock (``GET_LOCK``) was free, taken without waiting.

        Named locks belong to the session, not the transaction: the claim gives
        them back after its commit (``unlock_keys``). Their names are server-wide,
        so the database's name is part of each one.
        """
        names = [_lock_name(connection, key) for key in keys]
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["GET_LOCK(%s, 0)"] * len(names)), names)
            row = cursor.fetchone()
        taken = [n for n, got in enumerate(row) if got == 1]
        held = getattr(connection, "_django_jobs_key_locks", [])
        connection._django_jobs_key_locks = held + [names[n] for n in taken]  # type: ignore[attr-defined]
        return {keys[n] for n in taken}

    def unlock_keys(self, connection: BaseDatabaseWrapper) -> None:
        names = getattr(connection, "_django_jobs_key_locks", None)
        if not names:
            return
        connection._django_jobs_key_locks = []  # type: ignore[attr-defined]
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["RELEASE_LOCK(%s)"] * len(names)), names)

    def worker_ids(
        self, column: str, params: list[Any], worker_id: str | None
    ) -> tuple[str, list[Any]]:
        if worker_id is None:
            return (
                f"JSON_REMOVE({column}, CONCAT('$[', JSON_LENGTH({column}) - 1, ']'))",
                [*params, *params],
            )
        return f"JSON_ARRAY_APPEND({column}, '$', %s)", [*params, worker_id]

    def record_step(
        self, connection: BaseDatabaseWrapper, params: dict[str, Any], *, completed: bool
    ) -> bool:
        """The step's row, written only while the run is running under this lease.

        Two statements in one transaction: the run's row is read with a shared
        lock (which keeps a rescue from changing it until the transaction ends),
        then the step is inserted or updated.
        """
        ops = connection.ops
        now = timezone.now()
        started = params["started"]
        token = JobRun._meta.get_field("lease_token").get_db_prep_value(params["token"], connection)
        values = {
            **params,
            "started": ops.adapt_datetimefield_value(
                now if started is None else datetime.fromtimestamp(started, UTC)
            ),
            "now": ops.adapt_datetimefield_value(now),
        }
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(_lease_held(), [params["run"], token])
            if cursor.fetchone() is None:
                return False
            cursor.execute(_step_upsert(completed=completed), values)
            return True

    def complete_many(
        self,
        connection: BaseDatabaseWrapper,
        table: str,
        status: str,
        items: list[tuple[int, uuid.UUID, Any]],
    ) -> set[tuple[int, uuid.UUID]] | None:
        """Two statements for the whole batch, in one transaction: the runs' rows
        locked to read their lease tokens, then one ``UPDATE`` of those whose
        lease still holds (an ``UPDATE`` here says how many rows, not which)."""
        if len(items) < 2:
            return None  # one autocommit UPDATE costs less than a transaction
        quote = connection.ops.quote_name
        token_field = JobRun._meta.get_field("lease_token")
        ids = sorted({run_id for run_id, _, _ in items})
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, lease_token FROM {quote(table)} "
                f"WHERE id IN ({', '.join(['%s'] * len(ids))}) FOR UPDATE",
                ids,
            )
            current = {run_id: token_field.to_python(token) for run_id, token in cursor}
            held = [item for item in items if current.get(item[0]) == item[1]]
            if held:
                params: list[Any] = [status]
                for run_id, _, output in held:
                    text = None if output is None else json.dumps(output, cls=DjangoJSONEncoder)
                    params += [run_id, text]
                params += [run_id for run_id, _, _ in held]
                cursor.execute(
                    f"UPDATE {quote(table)} SET status = %s, "
                    f"output = CASE id {' '.join(['WHEN %s THEN %s'] * len(held))} END, "
                    "finished_at = CURRENT_TIMESTAMP(6), lease_token = NULL "
                    f"WHERE id IN ({', '.join(['%s'] * len(held))})",
                    params,
                )
        return {(run_id, token) for run_id, token, _ in held}

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
        if connection.features.can_return_rows_from_bulk_insert:
            return None  # MariaDB: bulk_create reads the ids back with RETURNING
        # MySQL cannot say which ids one multi-row INSERT took (with interleaved
        # auto-increment locks they need not be consecutive): a row at a time,
        # in one transaction.
        runs = []
        with transaction.atomic(using=connection.alias):
            for value, key, rate_key, hold, turn in zip(
                data, keys, rate_keys, holds, turns, strict=True
            ):
                run = copy(template)
                run._state = copy(template._state)
                run.input, run.concurrency_key, run.rate_key = value, key, rate_key
                run.hold, run.turn = hold, turn
                run.save(using=connection.alias, force_insert=True)
                runs.append(run)
        return runs

    def last_turn(
        self, connection: BaseDatabaseWrapper, pool: str, priority: int, tenant_id: str | None
    ) -> tuple[str, list[Any]] | None:
        """Over the virtual column ``ready_turn`` (a ready run's turn, else NULL) that
        the turns index is built on (migration 0013): one probe of that index."""
        quote = connection.ops.quote_name
        tenant = "tenant_id IS NULL" if tenant_id is None else "tenant_id = %s"
        params = [pool, priority] if tenant_id is None else [pool, priority, tenant_id]
        return (
            f"SELECT MAX(ready_turn) FROM {quote(JobRun._meta.db_table)} "
            f"WHERE pool = %s AND priority = %s AND {tenant}",
            params,
        )

    def delete(
        self, connection: BaseDatabaseWrapper, table: str, column: str, ids: list[Any]
    ) -> int:
        """Children before their parents: InnoDB checks foreign keys row by row (not at
        commit), and a child run always has a larger id than its parent."""
        quote = connection.ops.quote_name
        placeholders = ", ".join(["%s"] * len(ids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {quote(table)} WHERE {quote(column)} IN ({placeholders}) "
                f"ORDER BY {quote(column)} DESC",
                ids,
            )
            return int(cursor.rowcount)

    def prepare_control(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        with connection.cursor() as cursor:
            # Whole seconds only.
            cursor.execute(
                "SET SESSION innodb_lock_wait_timeout = %s", [max(1, math.ceil(seconds))]
            )

    def estimated_rows(self, connection: BaseDatabaseWrapper, table: str) -> int | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def connection_limit(self, connection: BaseDatabaseWrapper) -> int | None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@max_connections")
            row = cursor.fetchone()
        return None if row is None else int(row[0])


def _lock_name(connection: BaseDatabaseWrapper, key: str) -> str:
    """The named lock of concurrency ``key`` in this database (at most 64 characters)."""
    scope = f"{connection.settings_dict['NAME']}\0{key}".encode(errors="surrogatepass")
    return f"django_jobs:{hashlib.sha256(scope).hexdigest()[:40]}"


def _clock_offset(connection: BaseDatabaseWrapper) -> int:
    """Seconds between the session's clock (NOW(), column defaults) and UTC."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())")
        row = cursor.fetchone()
    return 0 if row is None else int(row[0])


@functools.cache
def _lease_held() -> str:
    table = JobRun._meta.db_table
    return f"SELECT 1 FROM {table} WHERE id = %s AND lease_token = %s LOCK IN SHARE MODE"


@functools.cache
def _step_upsert(*, completed: bool) -> str:
    """Insert the step, or overwrite a failed one (its attempts counted up), never a
    completed one. ``status`` is assigned last: each assignment sees the ones
    before it, and the others ask whether the row was completed before."""
    table = JobStep._meta.db_table
    status = JobStep.StepStatus.COMPLETED if completed else JobStep.StepStatus.FAILED
    output, error = ("%(output)s", "NULL") if completed else ("NULL", "%(error)s")
    kept = "status = 'completed'"
    return f"""
        INSERT INTO {table}
            (run_id, step_id, seq, status, attempts, output, error, started_at, finished_at)
        VALUES (%(run)s, %(step)s, %(seq)s, '{status}', 1, {output}, {error}, %(started)s, %(now)s)
        ON DUPLICATE KEY UPDATE
            seq = IF({kept}, seq, VALUES(seq)),
            attempts = IF({kept}, attempts, attempts + 1),
            output = IF({kept}, output, VALUES(output)),
            error = IF({kept}, error, VALUES(error)),
            started_at = IF({kept}, started_at, VALUES(started_at)),
            finished_at = IF({kept}, finished_at, VALUES(finished_at)),
            status = IF({kept}, status, VALUES(status))
    """
