"""PostgreSQL: one-statement claims, batched completions, prepared statements, NOTIFY.

Django's psycopg backend binds parameters on the client and prepares nothing,
so the server would plan every claim again; planning is a large share of a
small claim's cost. The hot statements (claim, batched completion, step
record) therefore go through a server-side-binding cursor on Django's own
connection, prepared on first use: same connection, same transaction, planned
once per connection. ``PREPARED_STATEMENTS = False`` turns this off (PgBouncer
in transaction mode before 1.21 cannot route prepared statements).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.db.models.expressions import DatabaseDefault
from django.db.models.functions import Now
from django.db.models.signals import post_init, pre_init

from ... import conf
from ...models import JobRun, JobStep, Status
from .base import Caps, Vendor, step_statement

# psycopg prepares a statement on its own after this many executions; Django
# disables that (None), and so would ``prepare=True``. A threshold no statement
# reaches turns it back on for ``prepare=True`` only, leaving the ORM's as they were.
_ONLY_WHEN_ASKED = 2**62

# Namespace of django_jobs' advisory locks (ASCII "jobs"), so that they cannot
# collide with an application's own one-argument advisory locks.
ADVISORY_NAMESPACE = 0x6A6F6273


class PostgreSQL(Vendor):
    listens = True
    # NOTIFY wakes idle workers; the poll is the fallback (a pooler without LISTEN).
    poll_interval = 1.0

    def unserved(self, connection: BaseDatabaseWrapper) -> str | None:
        return None

    def fetch(
        self, connection: BaseDatabaseWrapper, sql: str, params: list[Any] | dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        if not conf.get().PREPARED_STATEMENTS or not _psycopg3():
            return super().fetch(connection, sql, params)
        if connection.connection is None:
            connection.ensure_connection()
        with connection.wrap_database_errors:
            if isinstance(params, list) and len(sql) > _CONVERTED_ONCE:
                cursor = _cursor(connection, raw=True)
                cursor.execute(_numbered(sql), params, prepare=True)
            else:
                cursor = _cursor(connection)
                cursor.execute(sql, params, prepare=True)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows

    def clock(self, connection: BaseDatabaseWrapper) -> datetime:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (now,) = cursor.fetchone()
        return now  # type: ignore[no-any-return]

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
        statement = _claim_statement(
            connection, key, picked, tuple(fields), tuple(dates), plan, deferring, caps
        )
        # Inside a caller's transaction (drain() in a test), a savepoint: a refused
        # claim must not abort it, so that the two-statement claim can follow.
        atomic = connection.in_atomic_block
        if atomic:
            with transaction.atomic(using=connection.alias):
                return self.fetch(connection, statement, [worker_id, token, str(worker_id)])
        return self.fetch(connection, statement, [worker_id, token, str(worker_id)])

    def lock_keys(self, connection: BaseDatabaseWrapper, keys: list[str]) -> set[str]:
        """The keys whose transaction-scoped advisory lock was free (taken without waiting)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT key FROM unnest(%s::text[]) AS key "
                "WHERE pg_try_advisory_xact_lock(%s, hashtext(key))",
                [keys, ADVISORY_NAMESPACE],
            )
            return {row[0] for row in cursor.fetchall()}

    def worker_ids(
        self, column: str, params: list[Any], worker_id: str | None
    ) -> tuple[str, list[Any]]:
        if worker_id is None:
            return f"({column} - -1)", params
        return f"({column} || jsonb_build_array(%s::text))", [*params, worker_id]

    def complete_many(
        self,
        connection: BaseDatabaseWrapper,
        table: str,
        status: str,
        items: list[tuple[int, uuid.UUID, Any]],
    ) -> set[tuple[int, uuid.UUID]] | None:
        # One JSON document of (id, token, output) rows rather than a VALUES list:
        # one statement text for every batch size (prepared once), one parameter
        # to send. Fenced on the token alone, as leases.fenced().
        statement = f"""
            UPDATE {connection.ops.quote_name(table)} AS run
            SET status = %s, output = v.output, finished_at = STATEMENT_TIMESTAMP(),
                lease_token = NULL
            FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, token uuid, output jsonb)
            WHERE run.id = ANY(%s::bigint[]) AND run.id = v.id AND run.lease_token = v.token
            RETURNING run.id, v.token
        """
        rows = json.dumps(
            [
                {"id": run_id, "token": str(token), "output": output}
                for run_id, token, output in items
            ],
            # ASCII: text jsonb refuses (a lone surrogate) fails as a database
            # error of this batch, which is then written row by row.
            cls=DjangoJSONEncoder,
        )
        # The ids again as an array: the rows are found by primary key whatever the
        # table's statistics say (a join on the JSON rows alone was planned as a
        # scan of the table when ANALYZE last saw it nearly empty).
        # Written as the array's text: psycopg's dumper of a list of ints costs more
        # per completion than the rest of the statement's parameters.
        ids = "{" + ",".join(str(int(run_id)) for run_id, _, _ in items) + "}"
        return {
            (run_id, token)
            for run_id, token in self.fetch(connection, statement, [status, rows, ids])
        }

    def record_step(
        self, connection: BaseDatabaseWrapper, params: dict[str, Any], *, completed: bool
    ) -> bool:
        return bool(self.fetch(connection, _step_statement(completed=completed), params))

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
        """One ``INSERT ... SELECT FROM unnest(...)``: the runs differ only in input, keys,
        hold and turn.

        Returns the runs as if loaded from the database. The ids come back as one
        array and the time of the statement once, not as a row per run: reading
        a timestamp per row costs more than inserting the rows.
        """
        quote = connection.ops.quote_name
        columns: list[str] = []
        values: list[str] = []
        params: list[Any] = []
        now_columns = []  # columns whose database default is the statement's time
        for field in JobRun._meta.concrete_fields:
            if field.primary_key:
                continue
            columns.append(quote(str(field.column)))
            value = getattr(template, field.attname)
            if field.attname in ("input", "concurrency_key", "rate_key", "hold", "turn"):
                values.append(f"v.{field.attname}")
            elif isinstance(value, DatabaseDefault):
                # Now() is JobRun's only database default.
                assert isinstance(value.get_source_expressions()[0], Now), value
                now_columns.append(field.attname)
                values.append("STATEMENT_TIMESTAMP()")
            else:
                # CAST(), not %s::type: the parameter is bound on the client, and
                # "-32768::smallint" reads as -(32768::smallint), out of range.
                values.append(f"CAST(%s AS {field.cast_db_type(connection) or 'text'})")
                params.append(field.get_db_prep_save(value, connection))
        statement = (
            f"WITH inserted AS (INSERT INTO {quote(JobRun._meta.db_table)} ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} "
            "FROM unnest(%s::jsonb[], %s::text[], %s::text[], %s::text[], %s::bigint[]) "
            "WITH ORDINALITY AS v(input, concurrency_key, rate_key, hold, turn, n) "
            "ORDER BY v.n RETURNING id) "
            # Ids come from a sequence in insertion order, so sorted they match the inputs.
            "SELECT array_agg(id ORDER BY id), STATEMENT_TIMESTAMP() FROM inserted"
        )
        with connection.cursor() as cursor:
            cursor.execute(statement, [*params, texts, keys, rate_keys, holds, turns])
            ids, now = cursor.fetchone()
        fields = {
            field.attname: getattr(template, field.attname)
            for field in JobRun._meta.concrete_fields
        }
        fields.update(dict.fromkeys(now_columns, now))
        return [
            _loaded(
                connection.alias,
                {
                    **fields,
                    "id": run_id,
                    "input": value,
                    "concurrency_key": key,
                    "rate_key": rate_key,
                    "hold": hold,
                    "turn": turn,
                },
            )
            for run_id, value, key, rate_key, hold, turn in zip(
                ids, data, keys, rate_keys, holds, turns, strict=True
            )
        ]

    def prepare_control(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        """Bound lock waits, and no JIT compilation: a claim statement over a deep
        pending index can be costed past ``jit_above_cost`` (a claim for one kind
        of run read past the other's backlog before the claim's index had the
        kind), and then every execution was compiled (about 20 ms, for a
        statement of 1)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('jit', 'off', false)",
                [f"{max(1, round(seconds * 1000))}ms"],
            )

    def notify(self, connection: BaseDatabaseWrapper, channel: str, pools: list[str]) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, pool) FROM unnest(%s::text[]) AS pool", [channel, pools]
            )

    def estimated_rows(self, connection: BaseDatabaseWrapper, table: str) -> int | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table]
            )
            row = cursor.fetchone()
        return None if row is None else int(row[0])

    def connection_limit(self, connection: BaseDatabaseWrapper) -> int | None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('max_connections')::int")
            row = cursor.fetchone()
        return None if row is None else int(row[0])


# (database alias, the caller's key of its candidates, fields, dates, plan) -> the statement
_claim_statements: dict[
    tuple[str, Hashable, tuple[str, ...], tuple[str, ...], int, bool, Caps | None], str
] = {}

# The instants psycopg reads into a datetime, with a day to spare for time zones;
# a timestamptz column holds years up to 294276, and infinity.
_READABLE = "BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'"


def _claim_statement(
    connection: BaseDatabaseWrapper,
    key: Hashable,
    picked: Callable[[], Any],
    fields: tuple[str, ...],
    dates: tuple[str, ...],
    plan: int,
    deferring: bool = False,
    caps: Caps | None = None,
) -> str:
    """The one-statement claim: the ORM's locking SELECT inside an UPDATE ... RETURNING.

    Built once per candidates' query (pools, batch size), then sent as a prepared
    statement. Its constants (statuses, pools) are written into the text, not
    bound: a parameter in ``status = $1`` would keep the server from using the
    partial index on pending runs in a generic plan, so it would plan the claim
    again at every execution (a custom plan costs more than the claim).

    The server keeps a prepared statement's generic plan until the table's
    statistics change. A plan made while the table was nearly empty (a seq
    scan) stays cheap only while it is: a burst of runs before the next ANALYZE
    makes such claims slow. So ``plan`` is written into the text as
    a comment, and the worker passes a new number when work starts after an
    idle spell (and every minute): a new text is a new statement, planned for
    the table as it is now.
    """
    using = connection.alias
    cache_key = (using, key, fields, dates, plan, deferring, caps)
    if cache_key in _claim_statements:
        return _claim_statements[cache_key]
    for stale in [
        known
        for known in _claim_statements
        if known[4] < plan - 1 and _group(known[1]) == _group(key)
    ]:
        del _claim_statements[stale]
    # The ORM refuses to compile FOR UPDATE outside a transaction; nothing runs here.
    ops: Any = connection.ops  # PostgreSQL's, which can quote values into SQL
    sets = picked()
    with transaction.atomic(using=using):
        # The statement is run with parameters, so a "%" of a pool name is doubled.
        sqls = [
            ops.compose_sql(*rows.query.get_compiler(using).as_sql()).replace("%", "%%")
            for rows in sets
        ]
    picks = f"picked AS MATERIALIZED ({sqls[0]})"
    if len(sqls) > 1:
        # A pick per pool, each locked as read (FOR UPDATE is not allowed in a
        # UNION), merged in claim order; the rows picked beyond the batch are
        # unlocked when the statement's transaction ends, a moment later.
        query = sets[0].query
        limit = query.high_mark - query.low_mark
        picks = ", ".join(f"pick{n} AS MATERIALIZED ({sql})" for n, sql in enumerate(sqls))
        merged = " UNION ALL ".join(f"SELECT * FROM pick{n}" for n in range(len(sqls)))
        picks += (
            f", picked AS MATERIALIZED ({merged} "
            f"ORDER BY priority DESC, turn, run_at, id LIMIT {int(limit)})"
        )
    table = ops.quote_name(JobRun._meta.db_table)
    step_table = ops.quote_name(JobStep._meta.db_table)
    # A date the driver cannot read would fail the statement's result after its
    # UPDATE committed (the whole batch claimed, and lost): it comes back NULL,
    # and the last column says so.
    columns = {name: f"run.{ops.quote_name(name)}" for name in fields + dates}
    returning = ", ".join(
        f"CASE WHEN {columns[name]} {_READABLE} THEN {columns[name]} END"
        if name in dates
        else columns[name]
        for name in fields
    )
    dates_ok = " AND ".join(
        f"({columns[name]} IS NULL OR {columns[name]} {_READABLE})" for name in dates
    )
    # Of each concurrency key, as many rows (the first in claim order) as it has
    # free slots, each given one, and a key only under a transaction-scoped
    # advisory lock taken without waiting: two claims putting several keys into
    # the unique index at once could otherwise wait on each other in a cycle (see
    # holds.within_limits for the two-statement form). A run of limit 1 takes
    # slot 0: the candidates' filter saw its key free. A run of a larger limit
    # takes the nth free slot of its key, n its rank among the key's rows here.
    status = Status.RUNNING
    tenants = _tenant_slots(ops, table, caps)
    ranked = f"""
        ranked AS (
            SELECT id, concurrency_key, concurrency_limit, row_number() OVER (
                PARTITION BY concurrency_key ORDER BY priority DESC, turn, run_at, id
            ) AS nth{tenants.ranked}
            FROM picked {"WHERE NOT deferred" if deferring else ""}
        ),
        slotted AS MATERIALIZED (
            SELECT id, concurrency_key, CASE
                WHEN concurrency_key IS NULL THEN NULL
                WHEN concurrency_limit <= 1 THEN CASE WHEN nth = 1 THEN 0 END
                ELSE (
                    SELECT slot FROM generate_series(0, concurrency_limit - 1) AS slot
                    WHERE NOT EXISTS (
                        SELECT 1 FROM {table} AS busy
                        WHERE busy.concurrency_key = ranked.concurrency_key
                        AND busy.status = '{status}'
                        AND COALESCE(busy.concurrency_slot, 0) = slot
                    )
                    ORDER BY slot OFFSET nth - 1 LIMIT 1
                )
            END AS slot{tenants.slotted}
            FROM ranked
        )
    """
    update = f"""
        UPDATE {table} AS run
        SET status = '{status}', attempts = run.attempts + 1, claimed_by_id = %s,
            lease_token = %s, started_at = STATEMENT_TIMESTAMP(),
            worker_ids = run.worker_ids || jsonb_build_array(%s::text),
            concurrency_slot = CASE WHEN run.concurrency_key IS NOT NULL THEN (
                SELECT slot FROM slotted WHERE slotted.id = run.id
            ) END{tenants.set}
        WHERE run.id = ANY(ARRAY(
            SELECT id FROM slotted
            WHERE (concurrency_key IS NULL OR (
                slot IS NOT NULL
                AND pg_try_advisory_xact_lock({ADVISORY_NAMESPACE}, hashtext(concurrency_key))
            )){tenants.where}
        ))
        RETURNING {returning}, EXISTS (
            SELECT 1 FROM {step_table} AS step WHERE step.run_id = run.id
        ) AS has_steps, {dates_ok or "TRUE"} AS dates_ok
    """
    statement = f"""
        /* django_jobs claim, plan {plan} */
        WITH {picks}, {ranked}
    """
    if deferring:
        # The runs under a rate limit are picked in the same order as the others
        # (priority holds across both), but admitted apart (storage.ratelimits):
        # their ids come back after the claimed rows, each row saying which it is.
        nulls = ", ".join(["NULL"] * (len(fields) + 1))
        statement += f"""
            , claimed AS ({update})
            SELECT *, FALSE FROM claimed
            UNION ALL
            SELECT id, {nulls}, TRUE FROM picked WHERE deferred
        """
    else:
        statement += update
    _claim_statements[cache_key] = statement
    return statement


@dataclass(frozen=True)
class _TenantSlots:
    """The parts of the claim statement that give tenant slots (empty without caps)."""

    ranked: str = ""
    slotted: str = ""
    set: str = ""
    where: str = ""


def _tenant_slots(ops: Any, table: str, caps: Caps | None) -> _TenantSlots:
    """Under tenant ``caps``, a run of a capped tenant takes the nth free slot of its
    tenant's cap in its pool, n its rank among the tenant's rows here, under the
    tenant's advisory lock (named as ``storage.holds`` names it)."""
    if caps is None:
        return _TenantSlots()
    named, others = caps
    # The caps are the settings' numbers; the pool names are quoted as literals.
    # The statement is run with parameters, so a "%" of a pool name is doubled.
    whens = " ".join(
        f"WHEN {ops.compose_sql('%s', [pool]).replace('%', '%%')} THEN {int(cap)}"
        for pool, cap in named
    )
    default = "NULL" if others is None else str(int(others))
    cap = f"CASE pool {whens} ELSE {default} END" if whens else default
    return _TenantSlots(
        ranked=f""", pool, tenant_id, {cap} AS tenant_cap, row_number() OVER (
                PARTITION BY pool, tenant_id ORDER BY priority DESC, turn, run_at, id
            ) AS tenant_nth""",
        slotted=f""", pool, tenant_id, tenant_id IS NOT NULL AND tenant_cap IS NOT NULL AS capped,
            CASE WHEN tenant_id IS NULL OR tenant_cap IS NULL THEN NULL ELSE (
                SELECT slot FROM generate_series(0, tenant_cap - 1) AS slot
                WHERE NOT EXISTS (
                    SELECT 1 FROM {table} AS busy
                    WHERE busy.tenant_id = ranked.tenant_id AND busy.pool = ranked.pool
                    AND busy.status = '{Status.RUNNING}' AND busy.tenant_slot = slot
                )
                ORDER BY slot OFFSET tenant_nth - 1 LIMIT 1
            ) END AS tenant_slot""",
        set=""",
            tenant_slot = CASE WHEN run.tenant_id IS NOT NULL THEN (
                SELECT tenant_slot FROM slotted WHERE slotted.id = run.id
            ) END""",
        where=f"""
            AND (NOT capped OR (
                tenant_slot IS NOT NULL
                AND pg_try_advisory_xact_lock({ADVISORY_NAMESPACE}, hashtext(
                    'tenant' || chr(31) || pool || chr(31) || tenant_id
                ))
            ))""",
    )


def _group(key: Hashable) -> Hashable:
    """The group of a claim's key ``(group, limit)``: its statements share plan numbers."""
    return key[0] if isinstance(key, tuple) else key


@functools.cache
def _step_statement(*, completed: bool) -> str:
    """``FOR SHARE`` keeps the run running under this lease until the transaction
    ends, so a rescue cannot slip between the check and an atomic step's commit."""
    return step_statement(
        completed=completed,
        json="::jsonb",
        started="COALESCE(to_timestamp(%(started)s), now())",
        now="now()",
        lock="FOR SHARE",
    )


def _loaded(using: str, fields: dict[str, Any]) -> JobRun:
    """A JobRun as ``Model.from_db`` builds it, without the per-field ``__init__``.

    ``from_db`` costs more than the INSERT itself for large batches; it is used
    only when something listens to ``pre_init`` or ``post_init`` for JobRun.
    """
    if pre_init.has_listeners(JobRun) or post_init.has_listeners(JobRun):
        return JobRun.from_db(using, list(fields), list(fields.values()))
    run = JobRun.__new__(JobRun)
    run.__dict__.update(fields)
    run._state = ModelState()
    run._state.adding = False
    run._state.db = using
    return run


@functools.cache
def _psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def _cursor(connection: BaseDatabaseWrapper, *, raw: bool = False) -> Any:
    """This connection's server-side-binding cursor, made once per database session;
    ``raw``: the one that takes ``$1`` placeholders (see ``_numbered``)."""
    session = connection.connection
    attribute = "_django_jobs_raw_cursor" if raw else "_django_jobs_cursor"
    cursor = getattr(connection, attribute, None)
    if cursor is None or cursor.connection is not session or cursor.closed:
        import psycopg
        from psycopg.types.datetime import TimestamptzLoader

        if session.prepare_threshold is None:
            session.prepare_threshold = _ONLY_WHEN_ASKED
        cursor = (psycopg.RawCursor if raw else psycopg.Cursor)(session)
        # psycopg's own loader (in C with psycopg-binary) rather than Django's
        # Python one; both give aware datetimes in the session's time zone (UTC).
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        setattr(connection, attribute, cursor)
    return cursor


# psycopg turns a statement's %s placeholders into $1, $2... at every execution,
# remembering the result only for statements of at most 4,096 bytes
# (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH). The claim is longer (4,221
# characters for one pool, more under caps or limits, or for several pools):
# a statement that may be (past 1,024 characters, at most 4 bytes each) is
# turned here, once, and sent through a raw cursor, which sends it as it is.
_CONVERTED_ONCE = 1024
_PLACEHOLDER = re.compile(r"%%|%s")


@functools.lru_cache(maxsize=256)
def _numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders written ``$1``, ``$2``... and ``%%`` as
    ``%``: what psycopg would send for it."""
    numbers = itertools.count(1)
    return _PLACEHOLDER.sub(
        lambda found: "%" if found.group() == "%%" else f"${next(numbers)}", sql
    )
