"""Who records an attempt's outcome: the handler's thread or the worker, once."""

from __future__ import annotations

import uuid

from django_jobs.attempt import Attempt
from django_jobs.storage.claiming import Claim


def context() -> Attempt:
    return Attempt(Claim(run_id=1, attempt=1, lease_token=uuid.uuid4()), None)


def test_the_worker_fences_a_run_off_once_and_the_handler_then_records_nothing() -> None:
    ctx = context()
    assert ctx.fence_off()
    assert ctx.fenced_off
    assert not ctx.fence_off()  # a second watchdog pass does not end it again
    assert not ctx.own_outcome()


def test_a_handler_that_took_its_outcome_keeps_it() -> None:
    ctx = context()
    assert ctx.own_outcome()
    assert ctx.own_outcome()  # suspending, then ending canceled: still its own
    assert not ctx.fence_off()
    assert not ctx.fenced_off
