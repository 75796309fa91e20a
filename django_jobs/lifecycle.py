"""Transitions around durable execution: suspend and wake, cancel, close policies.

Like ``claims.py``, every write here is a conditional UPDATE on the run's
current status, so two actors never both win a transition. The locking rules:

* A child's terminal transition wakes its waiting parent in the same
  transaction. The child first locks the parent row (``FOR UPDATE``), then
  checks the parent's awaited runs in a fresh statement; a parent suspending
  holds that same row lock until it commits. Whichever comes second sees the
  other's work, so no wake-up is lost when the last children finish together.
* Close policies walk down the tree breadth-first inside the caller's
  transaction: a parent's unsuccessful end and its children's cancellation
  commit together.
* Locks are taken ancestors first: whoever ends or cancels a run that has a
  parent locks the parent row before the run's own, and a cascade locks
  children (in id order) after their parent. Two actors on one family thus
  queue instead of deadlocking.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models.functions import Now
from django.dispatch import Signal

from . import conf
from .claims import Claim, WorkerIds, fenced
from .models import UNSUCCESSFUL_STATUSES, ClosePolicy, JobRun, Status
from .notify import notify_pools
from .registry import run_ended
from .signals import run_canceled

logger = logging.getLogger(__name__)

UNFINISHED = (Status.PENDING, Status.RUNNING, Status.WAITING)


def _runs() -> Any:
    return JobRun.objects.using(conf.get().DATABASE)


def canceled_fields(reason: str) -> dict[str, Any]:
    """The columns written when a run ends canceled."""
    return {
        "status": Status.CANCELED,
        "finished_at": Now(),
        "lease_token": None,
        "awaiting": None,
        "cancel_reason": reason,
    }


# --- after a terminal transition -------------------------------------------------------


def lock_parent(parent_id: int | None) -> None:
    """Lock a run's parent row first (see the locking rules above)."""
    if parent_id is not None:
        list(_runs().select_for_update().filter(pk=parent_id).values_list("id"))


def after_end(run_id: int, parent_id: int | None, status: str) -> int:
    """Apply what a run's end implies, in the caller's transaction; return runs closed.

    An unsuccessful end applies the children's close policies (unless the run
    was canceled with ``cascade=False``); any end may wake a parent waiting for
    this run. The caller has locked the parent (``lock_parent``) beforehand.
    """
    closed = 0
    if status in UNSUCCESSFUL_STATUSES and (
        status != Status.CANCELED or _runs().filter(pk=run_id, cancel_cascade=True).exists()
    ):
        closed = close_children([run_id], reason=f"parent run {run_id} ended {status}")
    if parent_id is not None:
        wake_parent(parent_id)
    return closed


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
        # Locked (in id order, after their parents): a child cannot move between
        # running, waiting and pending while its policy is applied, so the
        # status read here is the status the UPDATEs below see. Unlocked, a child
        # suspending meanwhile escaped a request_cancel that matched only running rows.
        children = list(
            _runs()
            .select_for_update()
            .filter(parent_id__in=frontier, status__in=UNFINISHED)
            .exclude(close_policy=ClosePolicy.ABANDON)
            .order_by("pk")
            .values("id", "status", "close_policy", "parent_id")
        )
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


def cancel_now(run_ids: Iterable[int], reason: str) -> list[int]:
    """End the given unfinished runs canceled; return the ids that were changed.

    ``run_canceled`` is sent for each once the transaction commits.
    """
    ids = list(run_ids)
    if not ids:
        return []
    # Locked, so the rows returned are exactly the rows this UPDATE changes.
    rows = list(
        _runs()
        .select_for_update()
        .filter(pk__in=ids, status__in=UNFINISHED)
        .order_by("pk")
        .values_list("id", "job_type", "attempts")
    )
    changed = [row[0] for row in rows]
    _runs().filter(pk__in=changed, status__in=UNFINISHED).update(**canceled_fields(reason))
    transaction.on_commit(partial(_announce_canceled, rows), using=conf.get().DATABASE)
    return changed


def _announce_canceled(rows: list[tuple[int, str, int]]) -> None:
    for run_id, job_type, attempts in rows:
        announce(run_canceled, run_id, job_type, attempts, ended=True)


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
        run_ended(job_type, run_id)


def announce(
    signal: Signal, run_id: int, job_type: str, attempt: int, *, ended: bool, **extra: Any
) -> None:
    """Send a run signal once its transition is committed; a receiver's error is logged.

    For a run that ``ended``, its handler's ``on_end`` is called first, so
    that it sees the ended run before any receiver (which may retry it).
    ``extra`` are further keyword arguments of the signal (``exception``).
    """
    error = extra.get("exception")
    if ended and isinstance(error, BaseException):
        _ended_handling(error, job_type, run_id)
    elif ended:
        run_ended(job_type, run_id)
    for receiver, result in signal.send_robust(
        JobRun, run_id=run_id, job_type=job_type, attempt=attempt, **extra
    ):
        if isinstance(result, Exception):
            logger.error("run=%s signal receiver %r raised %r", run_id, receiver, result)


def request_cancel(run_ids: Iterable[int], reason: str, *, cascade: bool = True) -> int:
    """Ask running runs to stop; their worker notices within a heartbeat."""
    ids = list(run_ids)
    if not ids:
        return 0
    return int(
        _runs()
        .filter(pk__in=ids, status=Status.RUNNING, cancel_requested_at__isnull=True)
        .update(cancel_requested_at=Now(), cancel_reason=reason, cancel_cascade=cascade)
    )


# --- waiting and waking ----------------------------------------------------------------


def wake_parent(parent_id: int) -> bool:
    """Put ``parent_id`` back to pending if it waits and all it awaits has ended."""
    parent = (
        _runs()
        .select_for_update()
        .filter(pk=parent_id)
        .values("status", "awaiting", "pool")
        .first()
    )
    if parent is None or parent["status"] != Status.WAITING or not parent["awaiting"]:
        return False
    if _runs().filter(pk__in=parent["awaiting"]).unfinished().exists():
        return False
    woken = (
        _runs()
        .filter(pk=parent_id, status=Status.WAITING)
        .update(status=Status.PENDING, run_at=Now(), awaiting=None)
    )
    if woken:
        notify_pools([parent["pool"]])
    return bool(woken)


# What a suspension attempt found: suspended, taken away, or asked to cancel first.
SUSPENDED, LOST, CANCEL_REQUESTED = "suspended", "lost", "cancel_requested"


def suspend_for(claim: Claim, run_ids: list[int]) -> str:
    """Move a running run to waiting until ``run_ids`` have all ended.

    The attempt is given back: waiting is not a failure, and the run is
    claimed (and counted) again when it wakes. A run already asked to cancel
    does not suspend (``CANCEL_REQUESTED``): it must end now, closing its children.
    """
    with transaction.atomic(using=conf.get().DATABASE):
        outcome = _suspend(claim, awaiting=run_ids)
        if outcome == SUSPENDED:
            # The children may all have ended before the row lock above was taken.
            wake_parent(claim.run_id)
    return outcome


def suspend_until(claim: Claim, until: datetime) -> str:
    """Move a running run to waiting until ``until`` (a durable sleep)."""
    return _suspend(claim, awaiting=None, run_at=until)


def _suspend(claim: Claim, **fields: Any) -> str:
    if (
        fenced(claim)
        .filter(cancel_requested_at__isnull=True)
        .update(
            status=Status.WAITING,
            lease_token=None,
            claimed_by=None,
            attempts=claim.attempt - 1,
            worker_ids=WorkerIds(None),
            **fields,
        )
    ):
        return SUSPENDED
    return CANCEL_REQUESTED if fenced(claim).exists() else LOST


def wake_sleepers(limit: int = 1000) -> int:
    """Put runs whose durable sleep is over back to pending; return how many."""
    due = _runs().filter(status=Status.WAITING, awaiting__isnull=True, run_at__lte=Now())
    rows = list(due.values_list("id", "pool")[:limit])
    if not rows:
        return 0
    woken = (
        _runs()
        .filter(pk__in=[run_id for run_id, _ in rows], status=Status.WAITING, awaiting__isnull=True)
        .update(status=Status.PENDING)
    )
    if woken:
        notify_pools(pool for _, pool in rows)
    return int(woken)
