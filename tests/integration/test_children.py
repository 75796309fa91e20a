"""Child runs, waiting, durable sleep (in-process)."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from django_jobs import JobContext, job, start, transitions
from django_jobs.execution import Outcome, execute
from django_jobs.models import JobRun, Status
from django_jobs.storage import claiming
from django_jobs.testing import drain
from tests.factories import WorkerFactory
from tests.helpers import status_of
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def test_parent_waits_for_children_and_gets_their_outputs() -> None:
    parent = start("tests.parent", {"n": 3}, tenant_id="acme")
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED
    assert parent.output["outputs"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    children = JobRun.objects.filter(parent=parent).order_by("id")
    assert [c.pk for c in children] == parent.output["children"]
    assert {(c.root_id, c.tenant_id, c.status) for c in children} == {
        (parent.pk, "acme", Status.COMPLETED)
    }
    # Waiting gave the attempt back: the resumed run is still attempt 1.
    assert parent.attempts == 1
    assert Execution.objects.filter(run_id=parent.pk, job_type="effect:parent-body").count() == 2


def test_a_retried_parent_spawns_no_second_set() -> None:
    parent = start("tests.parent", {"n": 2, "fail_first": True})
    drain()
    parent.refresh_from_db()
    assert (parent.status, parent.attempts) == (Status.COMPLETED, 2)
    assert JobRun.objects.filter(parent=parent).count() == 2


def test_a_failed_child_raises_child_run_failed_in_the_parent() -> None:
    parent = start("tests.parent_of_failure")
    drain()
    parent.refresh_from_db()
    assert (parent.status, parent.output) == (Status.COMPLETED, "ChildRunFailed")


def test_wait_for_refuses_runs_that_are_not_children() -> None:
    stranger = start("tests.noop")
    parent = start("tests.parent", {"n": 0})
    # n=0: wait_for([]) returns at once; a stranger is refused (checked in a handler).
    drain()
    assert JobRun.objects.get(pk=parent.pk).status == Status.COMPLETED
    assert JobRun.objects.get(pk=stranger.pk).status == Status.COMPLETED


def test_durable_sleep_frees_the_run_and_resumes_after() -> None:
    run = start("tests.sleeper", {"seconds": 1.5})
    drain()
    run.refresh_from_db()
    assert run.status == Status.WAITING
    assert run.awaiting is None
    assert run.claimed_by_id is None
    assert transitions.wake_sleepers() == 0  # not yet
    assert drain() == 0
    time.sleep(1.6)
    assert drain() == 1  # woken by drain() itself
    run.refresh_from_db()
    assert (run.status, run.output, run.attempts) == (Status.COMPLETED, "rested", 1)
    names = list(Execution.objects.filter(run_id=run.pk).values_list("job_type", flat=True))
    assert sorted(names) == ["effect:after", "effect:before"]


# --- a durable sleep inside the handler's own transaction --------------------------------


@job("review.atomic_sleeper")
def atomic_sleeper(ctx: JobContext) -> str:
    # A handler that keeps its own work in one transaction (as @transaction.atomic would).
    with transaction.atomic():
        ctx.step("before", lambda: 1)
        ctx.sleep("nap", 3600)
    return "rested"


@pytest.mark.django_db
def test_a_durable_sleep_inside_the_handlers_own_transaction_is_not_lost() -> None:
    run = start("review.atomic_sleeper")
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    outcome = execute(claim)
    # Either the sleep is recorded (waiting) or the handler is told it cannot sleep
    # there (failed); never "running" under a lease nobody will ever write again.
    assert (outcome, status_of(run)) in {
        (Outcome.WAITING, Status.WAITING),
        (Outcome.FAILED, Status.FAILED),
    }
