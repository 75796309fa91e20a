"""The fenced writes to a claimed run: each one conditional ``UPDATE`` on its lease.

Every write to a claimed run (its outcome, a retry, a suspension, a release, its
progress) is ``UPDATE ... WHERE id = %s AND lease_token = %s``. A rowcount of 0
means the claim was lost (rescued, canceled, timed out): the caller writes
nothing else and logs it. Lease ages are compared with the database clock
(``Now()``), never a worker's.

These are the statements only; ``django_jobs.transitions`` decides which to
write and what else the change implies (a parent to lock first, children to close).
A write that takes a run out of running frees its concurrency key: once it
commits, the next run held for that key is released (``keys``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import F, Func, JSONField, Q
from django.db.models.functions import Now

from ..models import JobRun, Status
from . import after, runs, turns, using, vendors
from . import holds as held

if TYPE_CHECKING:
    from .claiming import Claim


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
        column, params = compiler.compile(self.get_source_expressions()[0])
        return vendors.of(connection).worker_ids(column, list(params), self.worker_id)


def fenced(claim: Claim) -> Any:
    """The run of ``claim``, only while it is still running under this lease.

    The token alone says both: a lease token is only ever set on a running run
    (the check constraint ``django_jobs_run_lease_running``). Not naming the
    status also keeps the planner on the primary key: statistics of a queue
    table often claim that no run is running, which makes a status index look
    cheaper than it is.
    """
    return runs().filter(pk=claim.run_id, lease_token=claim.lease_token)


def complete(claim: Claim, output: Any) -> bool:
    """Mark the run completed with ``output``; False when the lease was lost."""
    return _freed(
        claim,
        fenced(claim).update(
            status=Status.COMPLETED, output=output, finished_at=Now(), lease_token=None
        ),
    )


def _freed(claim: Claim, written: int) -> bool:
    """Whether the run was ``written`` out of running; if so, its slots are free."""
    if written:
        held.release_after_commit([claim.concurrency_key], [(claim.pool, claim.tenant_id)])
    return bool(written)


def complete_many(items: list[tuple[Claim, Any]]) -> set[tuple[int, uuid.UUID]]:
    """Complete many runs, in one statement where the database can, each fenced on its lease.

    Returns the (run id, lease token) pairs written: a stale claim of a run
    that was claimed again is told apart from the current one by its token.
    """
    connection = connections[using()]
    # In id order, so that two writers never lock the same rows in opposite orders.
    items = sorted(items, key=lambda item: item[0].run_id)
    written = vendors.of(connection).complete_many(
        connection,
        JobRun._meta.db_table,
        Status.COMPLETED,
        [(claim.run_id, claim.lease_token, output) for claim, output in items],
    )
    if written is not None:
        done = [
            claim
            for claim, _ in items
            # Only a run with a key or a tenant can free a slot someone waits for.
            if (claim.concurrency_key is not None or claim.tenant_id is not None)
            and (claim.run_id, claim.lease_token) in written
        ]
        held.release_after_commit(
            (claim.concurrency_key for claim in done),
            ((claim.pool, claim.tenant_id) for claim in done),
        )
        return written
    if len(items) == 1:
        return {
            (claim.run_id, claim.lease_token) for claim, output in items if complete(claim, output)
        }
    # A statement per run, all committed at once: one commit, not one per run.
    with transaction.atomic(using=using()):
        return {
            (claim.run_id, claim.lease_token) for claim, output in items if complete(claim, output)
        }


def end(claim: Claim, status: str, error: dict[str, Any] | None, **extra: Any) -> bool:
    """End the run ``status`` (failed, timed out, canceled) with ``error``; False when lost."""
    return _freed(
        claim,
        fenced(claim).update(
            status=status, error=error, finished_at=Now(), lease_token=None, **extra
        ),
    )


def reschedule(claim: Claim, error: dict[str, Any], delay: float) -> bool:
    """Put the run back to pending, due ``delay`` seconds from now; False when lost."""
    return _freed(
        claim,
        fenced(claim).update(
            status=Status.PENDING,
            error=error,
            run_at=after(delay),
            # Not due until then: out of the claims' way (storage.turns).
            turn=turns.later() if delay > 0 else F("turn"),
            lease_token=None,
            claimed_by=None,
            progress=None,
        ),
    )


def suspend(claim: Claim, **fields: Any) -> bool:
    """Move the run to waiting and give its attempt back, unless it was asked to
    cancel or is lost; whether it now waits."""
    return _freed(
        claim,
        fenced(claim)
        .filter(cancel_requested_at__isnull=True)
        .update(
            status=Status.WAITING,
            lease_token=None,
            claimed_by=None,
            attempts=claim.attempt - 1,
            worker_ids=WorkerIds(None),
            **fields,
        ),
    )


def release(worker_id: uuid.UUID, claims: Iterable[Claim]) -> int:
    """Give this worker's unfinished runs back to pending without spending an attempt.

    Only rows this worker still holds under the same lease are touched, never
    another worker's runs.
    """
    fence = Q()
    for claim in claims:
        fence |= Q(pk=claim.run_id, lease_token=claim.lease_token)
    if not fence:
        return 0
    return int(
        runs()
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


def write_progress(claim: Claim, progress: dict[str, Any]) -> bool:
    """Store the run's progress; False when the lease was lost."""
    return bool(fenced(claim).update(progress=progress))


def holds(claim: Claim) -> bool:
    """Whether the run is still running under this lease."""
    return bool(fenced(claim).exists())


def lock_held(claim: Claim) -> bool:
    """Lock the run's row (in the caller's transaction) while it is running under
    this lease; whether it is."""
    return bool(fenced(claim).select_for_update().values_list("pk", flat=True).first())


def cancel_requested(run_ids: list[int]) -> list[int]:
    """Of ``run_ids``, those asked to cancel or no longer running (taken away)."""
    if not run_ids:
        return []
    return list(
        runs()
        .filter(pk__in=run_ids)
        .filter(Q(cancel_requested_at__isnull=False) | ~Q(status=Status.RUNNING))
        .values_list("id", flat=True)
    )
