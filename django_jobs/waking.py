"""Runs that wait and wake: waits for children, durable sleeps, waits for events.

A waiting run holds no worker slot: a suspension gives its attempt back
(``storage.leases.suspend``), and the transition that ends the wait makes it
pending again, in the transaction of what ended it (a child's end, an event
sent) or by the worker's pass (a sleep or a deadline over). The locking rules
are those of ``transitions``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.utils import timezone

from . import conf
from .exceptions import InvalidTransition
from .locking import lock_rows, lock_run
from .models import NO_DEADLINE, UNFINISHED_STATUSES, JobEvent, Status
from .storage import events, leases, runs, steps
from .storage.claiming import Claim
from .storage.notify import notify_pools


def _using() -> str:
    return conf.get().DATABASE


def wake_parent(parent_id: int) -> bool:
    """Put ``parent_id`` back to pending if it waits and all it awaits has finished."""
    parent = (
        runs().select_for_update().filter(pk=parent_id).values("status", "awaiting", "pool").first()
    )
    if parent is None or parent["status"] != Status.WAITING or not parent["awaiting"]:
        return False
    if runs().filter(pk__in=parent["awaiting"]).unfinished().exists():
        return False
    woken = (
        runs()
        .filter(pk=parent_id, status=Status.WAITING)
        .update(status=Status.PENDING, run_at=Now(), awaiting=None)
    )
    if woken:
        notify_pools([parent["pool"]])
    return bool(woken)


# What a suspension attempt found: suspended, taken away, or asked to cancel first.
SUSPENDED, LOST, CANCEL_REQUESTED = "suspended", "lost", "cancel_requested"


def suspend_for(claim: Claim, run_ids: list[int]) -> str:
    """Move a running run to waiting until ``run_ids`` have all finished.

    The attempt is given back: waiting is not a failure, and the run is
    claimed (and counted) again when it wakes. A run already asked to cancel
    does not suspend (``CANCEL_REQUESTED``): it must finish now, closing its children.
    """
    with transaction.atomic(using=_using()):
        outcome = _suspend(claim, awaiting=run_ids, awaiting_event=None)
        if outcome == SUSPENDED:
            # The children may all have finished before the row lock above was taken.
            wake_parent(claim.run_id)
    return outcome


def suspend_until(claim: Claim, until: datetime) -> str:
    """Move a running run to waiting until ``until`` (a durable sleep)."""
    return _suspend(claim, awaiting=None, awaiting_event=None, run_at=until)


def _suspend(claim: Claim, **fields: Any) -> str:
    if leases.suspend(claim, **fields):
        return SUSPENDED
    return CANCEL_REQUESTED if leases.holds(claim) else LOST


# What a wait for an event found besides SUSPENDED, LOST and CANCEL_REQUESTED.
EVENT_TAKEN, EVENT_TIMED_OUT = "event_taken", "event_timed_out"


def take_event(
    claim: Claim, name: str, key: str, seq: int, until: datetime | None
) -> tuple[str, Any]:
    """A wait of a running run for an event ``name``, in one transaction under the
    run's row lock: take the oldest event of that name sent to it (one sent by
    ``until``, when that has passed) and record it as the step ``key``; else, when
    ``until`` has passed, record the timeout there; else move the run to waiting
    until such an event or ``until``. Returns (outcome, the step's output).

    A sender locks the same row before it stores an event and looks whether the
    run waits for it (``deliver_event``): whichever comes second sees the other's
    work, so an event is never left unseen beside a run that waits for it.
    """
    with transaction.atomic(using=_using()):
        if not leases.lock_held(claim):
            return LOST, None
        passed = until is not None and until <= timezone.now()
        taken = events.take(claim.run_id, name, key, sent_by=until if passed else None)
        outcome = EVENT_TAKEN
        if taken is None and passed:
            taken, outcome = {"timed_out": True}, EVENT_TIMED_OUT
        if taken is not None:
            # Under the row lock taken above: the lease holds until this commits.
            if not steps.record(claim, key, seq, output=taken):
                raise DatabaseError(f"run {claim.run_id}: the step {key!r} was not recorded")
            return outcome, taken
        fields = {"awaiting": None, "awaiting_event": name, "run_at": until or NO_DEADLINE}
        return _suspend(claim, **fields), None


def deliver_event(
    run_id: int, name: str, payload: Any, tenant_id: str | None
) -> tuple[JobEvent, str]:
    """Store an event ``name`` for an unfinished run, in the caller's transaction, and
    wake the run if it waits for that name; the event and the run's job type.
    ``RunNotFound`` for a missing run (or another tenant's), ``InvalidTransition``
    for a finished one: nothing is stored."""
    with transaction.atomic(using=_using()):
        run = lock_run(run_id, tenant_id)
        if run.status not in UNFINISHED_STATUSES:
            raise InvalidTransition(
                f"run {run_id} has finished ({run.status}): no wait would ever read "
                f"the event {name!r}"
            )
        event = events.store(run.pk, name, payload)
        woken = (
            runs()
            .filter(pk=run.pk, status=Status.WAITING, awaiting_event=name)
            .update(status=Status.PENDING, run_at=Now(), awaiting_event=None)
        )
        if woken:
            notify_pools([run.pool])
    return event, run.job_type


def wake_sleepers(limit: int = 1000) -> int:
    """Put runs whose durable sleep is over back to pending; return how many.

    Found without a lock, then locked by id (see the locking rules above) and
    checked again under the lock: a run another transaction holds (a cancel) is
    left for the next sweep, and one that went to sleep again meanwhile sleeps on.
    """
    due = runs().filter(status=Status.WAITING, awaiting__isnull=True, run_at__lte=Now())
    found = list(due.values_list("id", flat=True)[:limit])
    if not found:
        return 0
    with transaction.atomic(using=_using()):
        rows = [
            row
            for row in lock_rows(
                found,
                "status",
                "awaiting",
                "pool",
                skip_locked=True,
                over=ExpressionWrapper(Q(run_at__lte=Now()), output_field=BooleanField()),
            )
            if row["status"] == Status.WAITING and row["awaiting"] is None and row["over"]
        ]
        if not rows:
            return 0
        woken = (
            runs()
            .filter(pk__in=[row["id"] for row in rows])
            .update(status=Status.PENDING, awaiting_event=None)
        )
        notify_pools(row["pool"] for row in rows)
    return int(woken)
