"""A parent's close policies against children changing state at the same instant.

Two real connections: one moves a running child to waiting (or pending) and
holds its transaction open; the other cancels the parent meanwhile. Whatever
the order of their commits, the child must end canceled. A child completing
while its waiting parent is canceled must not deadlock with the cancel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_jobs import api, cancel, start, transitions
from django_jobs.execution import Outcome, execute
from django_jobs.models import ClosePolicy, JobRun, Status
from django_jobs.storage import claiming, leases
from django_jobs.storage.claiming import Claim
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory
from tests.helpers import in_thread, lock_waiters, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _suspend(claim: Claim) -> None:
    assert transitions.suspend_until(claim, timezone.now() + timedelta(hours=1)) == "suspended"


def _reschedule(claim: Claim) -> None:
    assert leases.reschedule(claim, {"type": "x", "message": "again"}, 3600)


@pytest.mark.parametrize("move", [_suspend, _reschedule], ids=["to waiting", "to pending"])
def test_a_request_cancel_child_changing_state_while_its_parent_is_canceled_is_canceled(
    move: Callable[[Claim], None],
) -> None:
    parent = JobRunFactory(status=Status.WAITING)
    child = RunningJobRunFactory(
        parent=parent, root=parent, close_policy=ClosePolicy.REQUEST_CANCEL
    )
    JobRun.objects.filter(pk=parent.pk).update(awaiting=[child.pk])
    claim = Claim(run_id=child.pk, attempt=1, lease_token=child.lease_token)
    moved, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def child_worker() -> None:
        try:
            with transaction.atomic():
                move(claim)
                moved.set()
                commit.wait(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            moved.set()
            connections.close_all()

    def operator() -> None:
        try:
            api.cancel(parent.pk, reason="stop")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    worker_thread = threading.Thread(target=child_worker)
    worker_thread.start()
    assert moved.wait(10)
    operator_thread = threading.Thread(target=operator)
    operator_thread.start()
    # The cancel reaches the child's row while the move is not yet committed.
    wait_until(lambda: lock_waiters() >= 1, timeout=10)
    commit.set()
    worker_thread.join(10)
    operator_thread.join(10)
    assert not errors, errors

    child.refresh_from_db()
    parent.refresh_from_db()
    assert parent.status == Status.CANCELED
    assert child.status == Status.CANCELED, (child.status, child.cancel_requested_at)
    assert child.cancel_reason == f"parent run {parent.pk} canceled"


# --- a child completing while its parent is canceled: no deadlock ------------------------


@pytest.mark.django_db(transaction=True)
def test_canceling_a_waiting_parent_while_its_child_completes_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = WorkerFactory()
    parent = start("tests.parent", {"n": 1})  # the child is a tests.echo, pool "echo"
    (parent_claim,) = claiming.claim_batch(worker.pk, ["default"], 1)
    assert execute(parent_claim) is Outcome.WAITING
    (child_claim,) = claiming.claim_batch(worker.pk, ["echo"], 1)

    # Hold the child's completion between its fenced UPDATE (child row locked) and
    # the wake-up of its parent (parent row locked next): the real order of _write.
    child_row_locked, go_on = threading.Event(), threading.Event()
    real_after_end = transitions.follow_up

    def after_end(*args: Any) -> int:
        child_row_locked.set()
        go_on.wait(10)
        return real_after_end(*args)

    monkeypatch.setattr(transitions, "follow_up", after_end)
    child_thread, _ = in_thread(lambda: execute(child_claim))
    assert child_row_locked.wait(10)
    cancel_thread, canceled = in_thread(lambda: cancel(parent.pk))
    wait_until(lambda: lock_waiters() >= 1, timeout=10)  # cancel() waits for the child row
    go_on.set()
    child_thread.join(30)
    cancel_thread.join(30)
    assert "error" not in canceled, f"cancel() raised {canceled.get('error')!r}"
