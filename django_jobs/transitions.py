"""Every change of a run's status: the only module that ends, cancels, suspends,
wakes, retries and rescues runs, and the only one that locks a parent first.

Each write is a conditional ``UPDATE`` on the run's current status (or on its
lease, ``storage.leases``), so two actors never both win a transition. The
locking rules:

* A child's end wakes its waiting parent in the same transaction. The child
  first locks the parent row (``FOR UPDATE``), then checks the parent's awaited
  runs in a fresh statement; a parent suspending holds that same row lock until
  it commits. Whichever comes second sees the other's work, so no wake-up is
  lost when the last children finish together.
* Close policies walk down the tree breadth-first inside the caller's
  transaction: a parent's unsuccessful end and its children's cancellation
  commit together.
* Locks are taken ancestors first: whoever ends or cancels a run that has a
  parent locks the parent row before the run's own, and a cascade locks
  children (in id order) after their parent. Two actors on one family thus
  queue instead of deadlocking.
* Rows are locked by primary key alone (``lock_rows``): a statement that finds
  runs by another column (a parent, a status) reads their ids without a lock,
  then locks those rows by id, in id order, decides on what it reads under the
  lock, and writes by id. InnoDB locks every index entry a locking statement
  reads, and where few runs are unfinished MariaDB reads them through a status
  index (or builds a rowid filter from one): such a statement locked entries
  of runs it did not change, in run_at order, and deadlocked with claims and
  with other sweeps.

A transition's signals are sent once it is committed, all through ``announce``:
straight after the transaction of a transition that opens its own (a claimed
run's end, a rescue), and at the commit of the caller's transaction for one
made inside it (``cancel_now``, close policies).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Case, F, When
from django.db.models.functions import Now
from django.dispatch import Signal

from . import conf
from .exceptions import InvalidTransition, WorkerLost
from .locking import change_locked, lock_parent, lock_rows, lock_run
from .models import (
    RETRYABLE_STATUSES,
    UNFINISHED_STATUSES,
    UNSUCCESSFUL_STATUSES,
    ClosePolicy,
    Hold,
    JobRun,
    JobStep,
    Status,
)
from .registry import run_finished
from .signals import run_canceled, run_failed
from .storage import events, holds, leases, runs, workers
from .storage.claiming import Claim
from .storage.notify import notify_pools
from .waking import (
    CANCEL_REQUESTED,
    EVENT_TAKEN,
    EVENT_TIMED_OUT,
    LOST,
    SUSPENDED,
    deliver_event,
    suspend_for,
    suspend_until,
    take_event,
    wake_parent,
    wake_sleepers,
)

# The waits' transitions live in ``waking`` and the locks in ``locking``: named
# here too, so that callers find every transition of a run in one place.
__all__ = [
    "CANCEL_REQUESTED",
    "EVENT_TAKEN",
    "EVENT_TIMED_OUT",
    "LOST",
    "SUSPENDED",
    "Announcement",
    "announce",
    "announce_at_commit",
    "cancel",
    "cancel_now",
    "canceled_fields",
    "close_children",
    "complete_many",
    "deliver_event",
    "finish",
    "follow_up",
    "lock_parent",
    "lock_rows",
    "lock_run",
    "release",
    "request_cancel",
    "rescue_stale",
    "retry",
    "retry_later",
    "suspend_for",
    "suspend_until",
    "take_event",
    "wake_parent",
    "wake_sleepers",
]

logger = logging.getLogger(__name__)


def _using() -> str:
    return conf.get().DATABASE


# --- announcing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Announcement:
    """A signal to send about a committed transition. For a run that ``finished``, its
    handler's ``on_end`` is called first, so that it sees the ended run before any
    receiver (which may retry it). ``extra`` are further keyword arguments of the
    signal (``exception``)."""

    signal: Signal
    run_id: int
    job_type: str
    attempt: int
    finished: bool
    extra: dict[str, Any] = field(default_factory=dict)


def announce(*announcements: Announcement) -> None:
    """Send the signals now; a receiver's error is logged, never raised."""
    for told in announcements:
        error = told.extra.get("exception")
        if told.finished and isinstance(error, BaseException):
            _ended_handling(error, told.job_type, told.run_id)
        elif told.finished:
            run_finished(told.job_type, told.run_id)
        for receiver, result in told.signal.send_robust(
            JobRun, run_id=told.run_id, job_type=told.job_type, attempt=told.attempt, **told.extra
        ):
            if isinstance(result, Exception):
                logger.error("run=%s signal receiver %r raised %r", told.run_id, receiver, result)


def announce_at_commit(announcements: list[Announcement]) -> None:
    """Send the signals once the caller's transaction commits (now, outside one)."""
    if announcements:
        transaction.on_commit(partial(announce, *announcements), using=_using())


def _ended_handling(error: BaseException, job_type: str, run_id: int) -> None:
    """Call ``on_end`` while ``error`` is being handled, as where it was raised.

    Django's ``task_finished`` logger takes the traceback from
    ``sys.exc_info()``, as its own backends send the signal in their ``except``
    block; this one runs after the commit, so the error is raised again here.
    """
    traceback = error.__traceback__
    try:
        raise error
    except BaseException:
        error.__traceback__ = traceback  # without this frame
        run_finished(job_type, run_id)


# --- a claimed run finishes, or goes again -----------------------------------------------


def finish(
    claim: Claim,
    status: str,
    *,
    output: Any = None,
    error: dict[str, Any] | None = None,
    follow_ups_apart: bool = False,
    **extra: Any,
) -> bool:
    """Finish a claimed run ``status`` under its lease, with what that implies; False
    when the lease was lost (nothing was written).

    A completed run without a parent implies nothing more: one autocommitted
    statement (the hot path). Otherwise the parent is locked first, and the
    run's children are closed and its parent woken in the same transaction.
    ``follow_ups_apart`` (a last resort, when that transaction was refused) writes
    the end on its own, then the follow-ups in a transaction of their own on a
    best-effort basis: applying them later is still right, since a parent is
    woken only if all it awaits has finished, and a parent that suspends
    afterwards looks for itself. ``extra`` are further columns to write.
    """
    parent_id = claim.parent_id
    if status == Status.COMPLETED and parent_id is None:
        return leases.complete(claim, output)
    if follow_ups_apart:
        if not _write_end(claim, status, output, error, extra):
            return False
        try:
            with transaction.atomic(using=_using()):
                lock_parent(parent_id)
                follow_up(claim.run_id, parent_id, status)
        except DatabaseError:
            logger.exception(
                "run=%s %s, but its parent and children could not be told", claim.run_id, status
            )
        return True
    with transaction.atomic(using=_using()):
        lock_parent(parent_id)
        if not _write_end(claim, status, output, error, extra):
            return False
        follow_up(claim.run_id, parent_id, status)
    return True


def complete_many(items: list[tuple[Claim, Any]]) -> set[tuple[int, uuid.UUID]]:
    """Finish many claimed runs without a parent completed, each under its lease, in
    one statement where the database can; the (run id, lease token) pairs written.

    Such an end implies nothing more (no parent to wake, no children to close), so
    the completer writes many at once (see ``finish`` for the single-run form).
    """
    return leases.complete_many(items)


def _write_end(
    claim: Claim, status: str, output: Any, error: dict[str, Any] | None, extra: dict[str, Any]
) -> bool:
    if status == Status.COMPLETED:
        return leases.complete(claim, output)
    return leases.end(claim, status, error, **extra)


def retry_later(claim: Claim, error: dict[str, Any], delay: float) -> bool:
    """Put a claimed run back to pending for its next attempt in ``delay`` seconds."""
    return leases.reschedule(claim, error, delay)


def follow_up(run_id: int, parent_id: int | None, status: str) -> int:
    """Apply what a run's end implies, in the caller's transaction; return runs closed.

    An unsuccessful end applies the children's close policies (unless the run
    was canceled with ``cascade=False``); any end may wake a parent waiting for
    this run. The caller has locked the parent (``lock_parent``) beforehand.
    """
    closed = 0
    if status in UNSUCCESSFUL_STATUSES and (
        status != Status.CANCELED or runs().filter(pk=run_id, cancel_cascade=True).exists()
    ):
        closed = close_children([run_id], reason=f"parent run {run_id} ended {status}")
    if parent_id is not None:
        wake_parent(parent_id)
    return closed


# --- canceling ---------------------------------------------------------------------------


def cancel(run_id: int, reason: str, *, cascade: bool, tenant_id: str | None) -> int:
    """Cancel a run; return how many runs were canceled or asked to cancel.

    A pending or waiting run finishes canceled at once; a running one is asked
    to stop. With ``cascade``, the children's close policies apply down the
    tree. Finished runs are left alone.
    """
    with transaction.atomic(using=_using()):
        run = lock_run(run_id, tenant_id, parent_first=True)
        if run.status not in UNFINISHED_STATUSES:
            return 0
        if run.status == Status.RUNNING:
            return request_cancel([run.pk], reason, cascade=cascade)
        count = len(cancel_now([run.pk], reason))
        if cascade:
            count += close_children([run.pk], reason=f"parent run {run.pk} canceled")
        if run.parent_id is not None:
            wake_parent(run.parent_id)
    return count


def close_children(parent_ids: Sequence[int], *, reason: str) -> int:
    """Apply the close policy of every unfinished child of ``parent_ids``, down the tree.

    ``terminate`` cancels the child at once (a running child's lease is dropped,
    so its late writes are fenced off); ``request_cancel`` cancels a pending or
    waiting child and asks a running one to stop cooperatively; ``abandon``
    leaves the child alone. Returns how many runs were canceled or asked.
    """
    count = 0
    frontier = list(parent_ids)
    while frontier:
        # Found without a lock, then locked by id (in id order, after their
        # parents): a child cannot move between running, waiting and pending while
        # its policy is applied, so the status read under the lock is the status
        # the UPDATEs below see. Unlocked, a child suspending meanwhile escaped a
        # request_cancel that matched only running rows. A child spawned after
        # the read waited for its parent's row, which the caller has written: it
        # is committed, and found, or comes after the commit.
        found = (
            runs()
            .filter(parent_id__in=frontier, status__in=UNFINISHED_STATUSES)
            .exclude(close_policy=ClosePolicy.ABANDON)
            .values_list("id", flat=True)
        )
        children = [
            child
            for child in lock_rows(found, "status", "close_policy")
            if child["status"] in UNFINISHED_STATUSES
        ]
        now_canceled = [
            c["id"]
            for c in children
            if c["close_policy"] == ClosePolicy.TERMINATE or c["status"] != Status.RUNNING
        ]
        asked = [c["id"] for c in children if c["id"] not in now_canceled]
        count += request_cancel(asked, reason)
        # Their parents have ended, so no wake-up is due; their own children are next.
        frontier = cancel_now(now_canceled, reason)
        count += len(frontier)
    return count


def canceled_fields(reason: str) -> dict[str, Any]:
    """The columns written when a run finishes canceled."""
    return {
        "status": Status.CANCELED,
        # A held run ends ready: it leaves the indexes of held runs (on MySQL and
        # MariaDB, which have no partial indexes, their entries).
        "hold": Hold.READY,
        "finished_at": Now(),
        "lease_token": None,
        "awaiting": None,
        # A wait for an event without a deadline had run_at far ahead. Before the
        # event's column: MySQL evaluates SET assignments left to right.
        "run_at": Case(When(awaiting_event__isnull=False, then=Now()), default=F("run_at")),
        "awaiting_event": None,
        "cancel_reason": reason,
    }


def cancel_now(run_ids: Iterable[int], reason: str) -> list[int]:
    """Finish the given unfinished runs canceled; return the ids that were changed.

    ``run_canceled`` is sent for each once the caller's transaction commits.
    """
    # Locked, so the rows returned are exactly the rows the UPDATE changes.
    rows = change_locked(
        run_ids,
        lambda row: row["status"] in UNFINISHED_STATUSES,
        "job_type",
        "attempts",
        "concurrency_key",
        "pool",
        "tenant_id",
        **canceled_fields(reason),
    )
    # A ready run of a key (or a tenant) canceled: a run held for it may be next.
    holds.release_after_commit(
        (row["concurrency_key"] for row in rows), ((row["pool"], row["tenant_id"]) for row in rows)
    )
    announce_at_commit(
        [
            Announcement(run_canceled, row["id"], row["job_type"], row["attempts"], finished=True)
            for row in rows
        ]
    )
    return [row["id"] for row in rows]


def request_cancel(run_ids: Iterable[int], reason: str, *, cascade: bool = True) -> int:
    """Ask running runs to stop; their worker notices within a heartbeat."""
    ids = list(run_ids)
    if not ids:
        return 0
    with transaction.atomic(using=_using(), savepoint=False):
        asked = change_locked(
            ids,
            lambda row: row["status"] == Status.RUNNING and row["cancel_requested_at"] is None,
            "cancel_requested_at",
            cancel_requested_at=Now(),
            cancel_reason=reason,
            cancel_cascade=cascade,
        )
    return len(asked)


# --- retrying a finished run -------------------------------------------------------------


def retry(run_id: int, *, reset_steps: bool, tenant_id: str | None) -> JobRun:
    """Put a failed, timed-out or canceled run back to pending, with a fresh set of attempts."""
    using = _using()
    with transaction.atomic(using=using):
        run = lock_run(run_id, tenant_id)
        if run.status not in RETRYABLE_STATUSES:
            raise InvalidTransition(
                f"run {run.pk} is {run.status}; "
                "only failed, timed-out or canceled runs can be retried"
            )
        runs().filter(pk=run.pk, status=run.status).update(
            status=Status.PENDING,
            run_at=Now(),
            attempts=0,
            worker_ids=[],
            finished_at=None,
            cancel_requested_at=None,
            cancel_reason="",
            cancel_cascade=True,
            lease_token=None,
            claimed_by=None,
            awaiting=None,
            awaiting_event=None,
            progress=None,
        )
        if reset_steps:
            JobStep.objects.using(using).filter(run_id=run.pk).delete()
            # Its waits run again from the start: the events they took are theirs again.
            events.give_back(run.pk)
        notify_pools([run.pool])
    # The whole row, now that it is known to be the caller's (lock_run loaded a few columns).
    retried: JobRun = runs().get(pk=run.pk)
    return retried


# --- giving runs back ------------------------------------------------------------------


def release(worker_id: uuid.UUID, claims: list[Claim]) -> int:
    """Give a stopping worker's unfinished runs back to pending, attempts unspent."""
    return leases.release(worker_id, claims)


def rescue_stale(
    pools: Sequence[str] | None, stale_after: float, limit: int = 500
) -> tuple[int, int]:
    """Take back running runs of workers silent for ``stale_after`` seconds.

    Runs with attempts left go back to pending; runs that spent them finish
    failed. Returns (requeued, failed). Safe in parallel: rows another sweeper
    holds are skipped, and every UPDATE re-checks ``status = 'running'``.
    """
    stale = workers.stale_runs(pools, stale_after)
    workers.mark_lost(stale_after)
    with transaction.atomic(using=_using()):
        # Unordered: the model's ordering (newest first) made the read walk the
        # whole table by primary key. SKIP LOCKED: it never waits for a lock.
        rows = list(
            stale.select_for_update(skip_locked=True)
            .order_by()
            .values(
                "id", "job_type", "attempts", "max_attempts", "parent_id", "lease_token", "pool"
            )[:limit]
        )
        again = [row["id"] for row in rows if row["attempts"] < row["max_attempts"]]
        # Running, and locked by the read above: written by id alone (see the
        # locking rules above).
        requeued = (
            runs()
            .filter(pk__in=again)
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
    # Runs without attempts left finish failed like any failed run (children
    # closed, a waiting parent woken), one transaction each so that the parent
    # is locked before the run. The lease read above fences each: a run claimed
    # again meanwhile is left alone.
    failed = sum(_fail_lost(row) for row in rows if row["attempts"] >= row["max_attempts"])
    return int(requeued), failed


WORKER_LOST = {
    "type": "django_jobs.exceptions.WorkerLost",
    "message": "the worker running this run stopped heartbeating and the run has no attempts left",
    "traceback": "",
    "attempt": None,
}


def _fail_lost(row: dict[str, Any]) -> int:
    claim = Claim(
        run_id=row["id"],
        attempt=row["attempts"],
        lease_token=row["lease_token"],
        job_type=row["job_type"],
        parent_id=row["parent_id"],
    )
    error = {**WORKER_LOST, "attempt": row["attempts"]}
    if not finish(claim, Status.FAILED, error=error):
        return 0
    lost = WorkerLost(WORKER_LOST["message"])
    announce(
        Announcement(
            run_failed,
            claim.run_id,
            claim.job_type,
            claim.attempt,
            finished=True,
            extra={"exception": lost},
        )
    )
    return 1
