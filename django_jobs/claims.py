"""Every statement that locks or fences job rows, so the locking story reads in one file.

The rules (DESIGN.md 1-5) in short:

* A claim is one short transaction: ``SELECT ... FOR UPDATE SKIP LOCKED`` picks due
  rows no other transaction holds, an ``UPDATE`` marks them running under a fresh
  lease token, and the commit releases the row locks. No handler runs inside it.
* Every later write to a claimed run (outcome, reschedule, release) is one
  conditional ``UPDATE ... WHERE id = %s AND status = 'running' AND lease_token = %s``.
  A rowcount of 0 means the claim was lost (rescued, canceled, timed out): the
  caller writes nothing else and logs it.
* Lease ages are compared with the database clock (``Now()``), never a worker's.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, NotSupportedError, connections, transaction
from django.db.models import (
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    JSONField,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.db.models.functions import Now

from . import conf, sql
from .exceptions import WorkerLost
from .models import JobPool, JobRun, JobStep, Status, Worker, WorkerStatus
from .notify import notify_pools
from .pools import record_pools
from .signals import run_failed

logger = logging.getLogger(__name__)

# The columns a worker needs to execute a claimed run; read in the claim itself.
CLAIM_FIELDS = (
    "id",
    "job_type",
    "pool",
    "priority",
    "input",
    "attempts",
    "max_attempts",
    "tenant_id",
    "parent_id",
    "root_id",
    "created_at",
    "run_at",
    "concurrency_key",
    "cancel_requested_at",
)


@dataclass(frozen=True, slots=True)
class Claim:
    """A run this worker holds: the row as claimed, plus the lease that fences it."""

    row: dict[str, Any]
    lease_token: uuid.UUID
    # Whether the run had recorded steps when claimed; None when not known.
    has_steps: bool | None = None
    run_id: int = field(init=False)
    attempt: int = field(init=False)  # this attempt's number, counted at claim

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_id", int(self.row["id"]))
        object.__setattr__(self, "attempt", int(self.row["attempts"]))


def _using() -> str:
    return conf.get().DATABASE


def _runs() -> Any:
    return JobRun.objects.using(_using())


def _after(seconds: float) -> ExpressionWrapper[Any]:
    """``now() + seconds`` on the database clock."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


# --- claiming -------------------------------------------------------------------------


def claim_batch(
    worker_id: uuid.UUID, pools: Sequence[str] | None, limit: int, *, plan: int = 0
) -> list[Claim]:
    """Claim up to ``limit`` due runs of ``pools`` (all pools when None) for this worker.

    Highest priority first, then the oldest ``run_at``. The attempt is counted
    here, at claim, so a run that kills its worker still spends its attempts.
    A new ``plan`` number makes the server plan the claim afresh (see
    ``_claim_statement``).
    """
    if limit <= 0:
        return []
    try:
        if connections[_using()].vendor == "postgresql":
            return _claim_in_one_statement(worker_id, pools, limit, plan)
        return _claim(worker_id, _candidates(pools), limit)
    except IntegrityError:
        # The unique index refused a second running run of one key: a claim that
        # took the key committed after this statement's snapshot was taken (or
        # the worker row is gone). Nothing was written; claim again the careful
        # way, whose second statement sees that commit.
        logger.debug("claim refused by an integrity constraint; claiming again", exc_info=True)
        try:
            return _claim(worker_id, _candidates(pools), limit)
        except IntegrityError:
            logger.warning("claim refused by an integrity constraint; retrying", exc_info=True)
            return []


def _candidates(pools: Sequence[str] | None) -> Any:
    """Due runs of ``pools`` that may be claimed now, in claim order, locked as read."""
    runs = _runs().due(pools)
    # Runs of a paused pool stay pending. The subquery is part of the statement,
    # so a pause takes effect at every worker's next claim, with no cache to expire.
    paused = JobPool.objects.using(_using()).filter(paused_at__isnull=False)
    runs = runs.exclude(pool__in=Subquery(paused.order_by().values("name")))
    # A run whose concurrency key is running now is not a candidate, so a blocked
    # run is passed over instead of being claimed and put back (no spinning).
    # Checked only for rows that have a key, so the planner does not turn it into
    # an anti-join that scans every running row on each claim.
    key_busy = _runs().filter(concurrency_key=OuterRef("concurrency_key"), status=Status.RUNNING)
    runs = runs.filter(Q(concurrency_key__isnull=True) | ~Exists(key_busy))
    # SKIP LOCKED: rows another worker is claiming right now are passed over
    # instead of waited for, so claimers never queue behind each other and
    # never both get one row. The filter and order match the partial index
    # django_jobs_run_claim, so the cost does not grow with finished history.
    return runs.order_by("-priority", "run_at").select_for_update(skip_locked=True)


# (database alias, pools, limit, plan) -> the claim statement
_claim_statements: dict[tuple[str, tuple[str, ...] | None, int, int], str] = {}


def _claim_statement(pools: Sequence[str] | None, limit: int, plan: int = 0) -> str:
    """The one-statement claim: the ORM's locking SELECT inside an UPDATE ... RETURNING.

    Built once per pools and batch size, then sent as a prepared statement
    (``sql.fetch``). Its constants (statuses, pools) are written into the text,
    not bound: a parameter in ``status = $1`` would keep the server from using
    the partial index on pending runs in a generic plan, so it would plan the
    claim again at every execution (a custom plan costs more than the claim).

    The server keeps a prepared statement's generic plan until the table's
    statistics change. A plan made while the table was nearly empty (a seq
    scan) stays cheap only while it is: a burst of runs before the next
    ANALYZE made claims 40 times slower. So ``plan`` is written into the text
    as a comment, and the worker passes a new number when work starts after
    an idle spell (and every minute): a new text is a new statement, planned
    for the table as it is now.
    """
    using = _using()
    cache_key = (using, None if pools is None else tuple(pools), limit, plan)
    if cache_key in _claim_statements:
        return _claim_statements[cache_key]
    for stale in [key for key in _claim_statements if key[3] < plan - 1]:
        del _claim_statements[stale]
    picked = _candidates(pools).values("id", "concurrency_key", "priority", "run_at")[:limit]
    connection = connections[using]
    # The ORM refuses to compile FOR UPDATE outside a transaction; nothing runs here.
    ops: Any = connection.ops  # PostgreSQL's, which can quote values into SQL
    with transaction.atomic(using=using):
        # The statement is run with parameters, so a "%" of a pool name is doubled.
        picked_sql = ops.compose_sql(*picked.query.get_compiler(using).as_sql()).replace("%", "%%")
    table = connection.ops.quote_name(JobRun._meta.db_table)
    step_table = connection.ops.quote_name(JobStep._meta.db_table)
    returning = ", ".join(f"run.{connection.ops.quote_name(name)}" for name in CLAIM_FIELDS)
    # One row per concurrency key (the first in claim order), and a key only
    # under a transaction-scoped advisory lock taken without waiting: two claims
    # putting several keys into the unique index at once could otherwise wait
    # on each other in a cycle (see _one_per_key for the two-statement form).
    statement = f"""
        /* django_jobs claim, plan {plan} */
        WITH picked AS MATERIALIZED ({picked_sql}),
        ranked AS (
            SELECT id, concurrency_key, row_number() OVER (
                PARTITION BY concurrency_key ORDER BY priority DESC, run_at
            ) AS nth
            FROM picked
        )
        UPDATE {table} AS run
        SET status = '{Status.RUNNING}', attempts = run.attempts + 1, claimed_by_id = %s,
            lease_token = %s, started_at = STATEMENT_TIMESTAMP(),
            worker_ids = run.worker_ids || jsonb_build_array(%s::text)
        FROM ranked
        WHERE run.id = ranked.id AND run.status = '{Status.PENDING}' AND (
            ranked.concurrency_key IS NULL OR (
                ranked.nth = 1
                AND pg_try_advisory_xact_lock(
                    {ADVISORY_NAMESPACE}, hashtext(ranked.concurrency_key)
                )
            )
        )
        RETURNING {returning}, EXISTS (
            SELECT 1 FROM {step_table} AS step WHERE step.run_id = run.id
        ) AS has_steps
    """
    _claim_statements[cache_key] = statement
    return statement


def _claim_in_one_statement(
    worker_id: uuid.UUID, pools: Sequence[str] | None, limit: int, plan: int
) -> list[Claim]:
    token = uuid.uuid4()
    statement = _claim_statement(pools, limit, plan)
    # Inside a caller's transaction (drain() in a test), a savepoint: a refused
    # claim must not abort it, so that the two-statement claim can follow.
    in_transaction = connections[_using()].in_atomic_block
    with transaction.atomic(using=_using()) if in_transaction else nullcontext():
        rows = sql.fetch(_using(), statement, [worker_id, token, str(worker_id)])
    claims = []
    for values in rows:
        row = dict(zip(CLAIM_FIELDS, values[:-1], strict=True))
        # Django reads jsonb as text, for the model field to decode.
        row["input"] = {} if row["input"] == "{}" else json.loads(row["input"])
        claims.append(Claim(row=row, lease_token=token, has_steps=values[-1]))
    # Highest priority first (RETURNING has no order); the whole batch starts at once.
    claims.sort(key=lambda claim: -claim.row["priority"])
    return claims


def _claim(worker_id: uuid.UUID, runs: Any, limit: int) -> list[Claim]:
    """The two-statement claim (other databases, and after a key conflict)."""
    token = uuid.uuid4()
    with transaction.atomic(using=_using()):
        rows = list(runs.values(*CLAIM_FIELDS)[:limit])
        rows = _one_per_key(rows)
        if not rows:
            return []
        # The rows stay locked by this transaction until commit, so this UPDATE
        # cannot race another claimer; the status condition is belt and braces.
        _runs().filter(pk__in=[row["id"] for row in rows], status=Status.PENDING).update(
            status=Status.RUNNING,
            attempts=F("attempts") + 1,
            claimed_by_id=worker_id,
            lease_token=token,
            started_at=Now(),
            worker_ids=WorkerIds(worker_id),
        )
    for row in rows:
        row["attempts"] += 1
    return [Claim(row=row, lease_token=token) for row in rows]


def _one_per_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep at most one row per concurrency key, and only keys no other claim is taking.

    Two claims inserting several keys into the unique index at once could wait
    on each other's uncommitted keys in a cycle (a deadlock). So a key is only
    claimed under a transaction-scoped advisory lock taken without waiting: a
    key another claim is taking right now is skipped. Other databases take at
    most one keyed run per claim, which cannot form a cycle.
    """
    first: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["concurrency_key"] is not None:
            first.setdefault(row["concurrency_key"], row)
    if not first:
        return rows
    allowed = _lock_keys(list(first))
    kept_ids = {row["id"] for key, row in first.items() if key in allowed}
    return [row for row in rows if row["concurrency_key"] is None or row["id"] in kept_ids]


# Namespace of django_jobs' advisory locks (ASCII "jobs"), so that they cannot
# collide with an application's own one-argument advisory locks.
ADVISORY_NAMESPACE = 0x6A6F6273


def _lock_keys(keys: list[str]) -> set[str]:
    connection = connections[_using()]
    if connection.vendor != "postgresql":
        return set(keys[:1])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key FROM unnest(%s::text[]) AS key "
            "WHERE pg_try_advisory_xact_lock(%s, hashtext(key))",
            [keys, ADVISORY_NAMESPACE],
        )
        locked = {row[0] for row in cursor.fetchall()}
    if not locked:
        return locked
    # A claim that held one of these keys may have committed after this
    # claim's first statement began; this new statement sees it.
    busy = set(
        _runs()
        .filter(concurrency_key__in=locked, status=Status.RUNNING)
        .values_list("concurrency_key", flat=True)
    )
    return locked - busy


class WorkerIds(Func):
    """``worker_ids`` with ``worker_id`` appended, or with its last entry removed (None).

    Kept in step with ``attempts``: an attempt counted at claim appends its
    worker, an attempt given back (a release, a suspension) removes it.
    """

    output_field = JSONField()

    def __init__(self, worker_id: uuid.UUID | None) -> None:
        super().__init__(F("worker_ids"))
        self.worker_id = None if worker_id is None else str(worker_id)

    def as_sql(self, compiler: Any, connection: Any, *args: Any, **extra: Any) -> Any:
        raise NotSupportedError("django_jobs records attempts on PostgreSQL and SQLite only")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        column, params = compiler.compile(self.get_source_expressions()[0])
        if self.worker_id is None:
            return f"({column} - -1)", params
        return f"({column} || jsonb_build_array(%s::text))", [*params, self.worker_id]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        column, params = compiler.compile(self.get_source_expressions()[0])
        if self.worker_id is None:
            return f"json_remove({column}, '$[#-1]')", params
        return f"json_insert({column}, '$[#]', %s)", [*params, self.worker_id]


# --- fenced outcome writes ------------------------------------------------------------


def fenced(claim: Claim) -> Any:
    """The run of ``claim``, only while it is still running under this lease.

    The token alone says both: a lease token is only ever set on a running run
    (the check constraint ``django_jobs_run_lease_running``). Not naming the
    status also keeps the planner on the primary key: statistics of a queue
    table often claim that no run is running, which makes a status index look
    cheaper than it is.
    """
    return _runs().filter(pk=claim.run_id, lease_token=claim.lease_token)


def complete(claim: Claim, output: Any) -> bool:
    """Mark the run completed with ``output``; False when the lease was lost."""
    return bool(
        fenced(claim).update(
            status=Status.COMPLETED, output=output, finished_at=Now(), lease_token=None
        )
    )


def fail(claim: Claim, error: dict[str, Any]) -> bool:
    """Mark the run failed for good; False when the lease was lost."""
    return end(claim, Status.FAILED, error)


def reschedule(claim: Claim, error: dict[str, Any], delay: float) -> bool:
    """Put the run back to pending, due ``delay`` seconds from now; False when lost."""
    return bool(
        fenced(claim).update(
            status=Status.PENDING,
            error=error,
            run_at=_after(delay),
            lease_token=None,
            claimed_by=None,
            progress=None,
        )
    )


def end(claim: Claim, status: str, error: dict[str, Any] | None, **extra: Any) -> bool:
    """End the run ``status`` (failed, timed out, canceled) with ``error``; False when lost."""
    return bool(
        fenced(claim).update(
            status=status, error=error, finished_at=Now(), lease_token=None, **extra
        )
    )


def release(worker_id: uuid.UUID, claims: Iterable[Claim]) -> int:
    """Give this worker's unfinished runs back to pending without spending an attempt.

    Only rows this worker still holds under the same lease are touched: never
    another worker's runs (the reference worker's flaw).
    """
    fence = Q()
    for claim in claims:
        fence |= Q(pk=claim.run_id, lease_token=claim.lease_token)
    if not fence:
        return 0
    return int(
        _runs()
        .filter(fence, status=Status.RUNNING, claimed_by_id=worker_id)
        .update(
            status=Status.PENDING,
            attempts=F("attempts") - 1,
            worker_ids=WorkerIds(None),
            run_at=Now(),
            lease_token=None,
            claimed_by=None,
            progress=None,
        )
    )


def cancel_requested(run_ids: list[int]) -> list[int]:
    """Of ``run_ids``, those asked to cancel or no longer running (taken away)."""
    if not run_ids:
        return []
    return list(
        _runs()
        .filter(pk__in=run_ids)
        .filter(Q(cancel_requested_at__isnull=False) | ~Q(status=Status.RUNNING))
        .values_list("id", flat=True)
    )


# --- workers, heartbeats and rescue ---------------------------------------------------


def register_worker(
    hostname: str,
    pid: int,
    pools: Sequence[str] | None,
    concurrency: int,
    worker_id: uuid.UUID | None = None,
) -> Worker:
    """Insert this worker's row (again, under the same id, when ``worker_id`` is given)."""
    worker = Worker(
        id=worker_id or uuid.uuid4(),
        hostname=hostname,
        pid=pid,
        pools=list(pools or []),
        concurrency=concurrency,
    )
    worker.save(using=_using(), force_insert=True)
    if pools:
        # The admin's pool list shows every pool a worker has served.
        record_pools(pools)
    return worker


def heartbeat(worker_id: uuid.UUID, status: str) -> bool:
    """Record that this worker is alive; False when its row is gone."""
    return bool(
        Worker.objects.using(_using())
        .filter(pk=worker_id)
        .update(heartbeat_at=Now(), status=status)
    )


def stop_worker(worker_id: uuid.UUID) -> None:
    Worker.objects.using(_using()).filter(pk=worker_id).update(
        status=WorkerStatus.STOPPED, stopped_at=Now(), heartbeat_at=Now()
    )


def rescue_stale(
    pools: Sequence[str] | None, stale_after: float, limit: int = 500
) -> tuple[int, int]:
    """Take back running runs of workers silent for ``stale_after`` seconds.

    Liveness is the holder's heartbeat, never the run's age: a long job on a live
    worker is left alone however long it runs. Runs with attempts left go back
    to pending; runs that spent them end failed. Returns (requeued, failed).
    Safe in parallel: rows another sweeper holds are skipped, and every UPDATE
    re-checks ``status = 'running'``.
    """
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(seconds=stale_after)), output_field=DateTimeField()
    )
    stale = Q(claimed_by__isnull=True) | Q(claimed_by__heartbeat_at__lt=cutoff)
    runs = _runs().filter(stale, status=Status.RUNNING)
    if pools is not None:
        runs = runs.filter(pool__in=pools)
    # Its own statement, outside the transaction below: no worker row stays locked
    # while runs are being swept.
    Worker.objects.using(_using()).filter(
        status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING], heartbeat_at__lt=cutoff
    ).update(status=WorkerStatus.LOST)
    with transaction.atomic(using=_using()):
        rows = list(
            runs.select_for_update(skip_locked=True, of=("self",)).values(
                "id", "job_type", "attempts", "max_attempts", "parent_id", "lease_token", "pool"
            )[:limit]
        )
        again = [row["id"] for row in rows if row["attempts"] < row["max_attempts"]]
        requeued = (
            _runs()
            .filter(pk__in=again, status=Status.RUNNING)
            .update(
                status=Status.PENDING,
                run_at=Now(),
                lease_token=None,
                claimed_by=None,
                progress=None,
            )
        )
        if requeued:
            notify_pools(row["pool"] for row in rows if row["id"] in again)
    # Runs without attempts left end failed like any failed run (children
    # closed, a waiting parent woken), one transaction each so that the parent
    # is locked before the run (lifecycle's ancestors-first order). The lease
    # read above fences each: a run claimed again meanwhile is left alone.
    failed = sum(_fail_lost(row) for row in rows if row["attempts"] >= row["max_attempts"])
    return int(requeued), failed


WORKER_LOST = {
    "type": "django_jobs.exceptions.WorkerLost",
    "message": "the worker running this run stopped heartbeating and the run has no attempts left",
    "traceback": "",
    "attempt": None,
}


def _fail_lost(row: dict[str, Any]) -> int:
    from .lifecycle import after_end, announce, lock_parent  # lifecycle builds on this module

    claim = Claim(
        row={"id": row["id"], "attempts": row["attempts"]}, lease_token=row["lease_token"]
    )
    with transaction.atomic(using=_using()):
        lock_parent(row["parent_id"])
        if not end(claim, Status.FAILED, {**WORKER_LOST, "attempt": row["attempts"]}):
            return 0
        after_end(row["id"], row["parent_id"], Status.FAILED)
    lost = WorkerLost(WORKER_LOST["message"])
    announce(run_failed, row["id"], row["job_type"], row["attempts"], ended=True, exception=lost)
    return 1
