"""A parent's close policies against children changing state at the same instant.

Two real connections: one moves a running child to waiting (or pending) and
holds its transaction open; the other cancels the parent meanwhile. Whatever
the order of their commits, the child must end canceled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_jobs import api, claims, lifecycle
from django_jobs.claims import Claim
from django_jobs.models import ClosePolicy, JobRun, Status
from tests.factories import JobRunFactory, RunningJobRunFactory
from tests.helpers import lock_waiters, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _suspend(claim: Claim) -> None:
    assert lifecycle.suspend_until(claim, timezone.now() + timedelta(hours=1)) == "suspended"


def _reschedule(claim: Claim) -> None:
    assert claims.reschedule(claim, {"type": "x", "message": "again"}, 3600)


@pytest.mark.parametrize("move", [_suspend, _reschedule], ids=["to waiting", "to pending"])
def test_a_request_cancel_child_changing_state_while_its_parent_is_canceled_is_canceled(
    move: Callable[[Claim], None],
) -> None:
    parent = JobRunFactory(status=Status.WAITING)
    child = RunningJobRunFactory(
        parent=parent, root=parent, close_policy=ClosePolicy.REQUEST_CANCEL
    )
    JobRun.objects.filter(pk=parent.pk).update(awaiting=[child.pk])
    claim = Claim(row={"id": child.pk, "attempts": 1}, lease_token=child.lease_token)
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
