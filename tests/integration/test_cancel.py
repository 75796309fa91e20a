"""cancel() and retry() through the api, with close policies down the tree."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from django_jobs import JobContext, cancel, retry, signals, start
from django_jobs.attempt import Attempt
from django_jobs.exceptions import InvalidTransition, RunNotFound
from django_jobs.execution import Outcome, execute
from django_jobs.models import ClosePolicy, JobRun, JobStep, Status
from django_jobs.storage import claiming
from django_jobs.testing import drain
from tests.factories import JobRunFactory, JobStepFactory, RunningJobRunFactory, WorkerFactory
from tests.helpers import status_of

pytestmark = pytest.mark.django_db


def status(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def test_a_pending_run_is_canceled_at_once() -> None:
    run = start("tests.noop")
    assert cancel(run.pk, reason="customer asked") == 1
    run.refresh_from_db()
    assert (run.status, run.cancel_reason) == (Status.CANCELED, "customer asked")
    assert run.finished_at is not None
    assert drain() == 0


def test_cancel_is_idempotent_and_leaves_finished_runs_alone() -> None:
    run = start("tests.noop")
    assert cancel(run.pk) == 1
    assert cancel(run.pk) == 0
    done = JobRunFactory(status=Status.COMPLETED)
    assert cancel(done.pk) == 0
    assert status(done) == Status.COMPLETED


def test_a_running_run_is_asked_to_cancel() -> None:
    run = RunningJobRunFactory()
    assert cancel(run.pk) == 1
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    assert run.cancel_requested_at is not None
    assert cancel(run.pk) == 0  # already asked


def test_a_waiting_run_is_canceled_at_once() -> None:
    run = JobRunFactory(status=Status.WAITING)
    assert cancel(run.pk) == 1
    assert status(run) == Status.CANCELED


def child(parent: JobRun, policy: str, **fields: Any) -> JobRun:
    factory = RunningJobRunFactory if fields.pop("running", False) else JobRunFactory
    return factory(parent=parent, root=parent.root or parent, close_policy=policy, **fields)


def test_cascade_applies_close_policies_over_three_generations() -> None:
    root = JobRunFactory(status=Status.WAITING)
    terminate = child(root, ClosePolicy.TERMINATE)
    abandon = child(root, ClosePolicy.ABANDON)
    polite_running = child(root, ClosePolicy.REQUEST_CANCEL, running=True)
    grandchild = child(terminate, ClosePolicy.TERMINATE, running=True)
    great_grandchild = child(grandchild, ClosePolicy.REQUEST_CANCEL)
    abandoned_grandchild = child(abandon, ClosePolicy.TERMINATE)
    finished = child(terminate, ClosePolicy.TERMINATE, status=Status.COMPLETED)

    # root, terminate, grandchild, great_grandchild canceled; polite_running asked.
    assert cancel(root.pk) == 5
    assert status(root) == Status.CANCELED
    assert status(terminate) == Status.CANCELED
    assert status(grandchild) == Status.CANCELED  # terminate: a running child is fenced off
    assert JobRun.objects.get(pk=grandchild.pk).lease_token is None
    assert status(great_grandchild) == Status.CANCELED  # pending: request_cancel cancels at once
    polite_running.refresh_from_db()
    assert (polite_running.status, polite_running.cancel_requested_at is not None) == (
        Status.RUNNING,
        True,
    )
    assert status(abandon) == Status.PENDING
    assert status(abandoned_grandchild) == Status.PENDING
    assert status(finished) == Status.COMPLETED


def test_without_cascade_children_are_left_alone() -> None:
    root = JobRunFactory()
    kid = child(root, ClosePolicy.TERMINATE)
    assert cancel(root.pk, cascade=False) == 1
    assert status(kid) == Status.PENDING


def test_a_parent_that_fails_closes_its_children() -> None:
    parent = start("tests.parent", {"n": 2, "child": "tests.backoff"})
    drain()  # the parent waits; the children retry in an hour
    assert status(parent) == Status.WAITING
    kids = list(JobRun.objects.filter(parent=parent))
    assert {k.status for k in kids} == {Status.PENDING}
    cancel(parent.pk)
    assert {status(k) for k in kids} == {Status.CANCELED}


def test_a_parent_that_completes_leaves_fire_and_forget_children_running() -> None:
    parent = start("tests.noop")
    kid = child(parent, ClosePolicy.TERMINATE, pool="elsewhere")
    drain("default")
    assert status(parent) == Status.COMPLETED
    assert status(kid) == Status.PENDING


def test_canceling_a_child_wakes_its_waiting_parent_with_child_run_canceled() -> None:
    parent = start("tests.parent_of_failure")  # spawns tests.permanent, waits for it
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    execute(claim)
    assert status(parent) == Status.WAITING
    kid = JobRun.objects.get(parent=parent)
    assert cancel(kid.pk) == 1
    assert status(parent) == Status.PENDING
    drain()
    parent.refresh_from_db()
    assert (parent.status, parent.output) == (Status.COMPLETED, "ChildRunCanceled")


def test_tenant_scoping_refuses_other_tenants() -> None:
    run = start("tests.noop", tenant_id="acme")
    with pytest.raises(RunNotFound) as other_tenant:
        cancel(run.pk, tenant_id="globex")
    with pytest.raises(RunNotFound) as missing:
        cancel(run.pk + 1000, tenant_id="globex")
    # Another tenant's run reads exactly like a missing one.
    assert str(other_tenant.value) == str(missing.value).replace(str(run.pk + 1000), str(run.pk))
    assert status(run) == Status.PENDING
    assert cancel(run.pk, tenant_id="acme") == 1
    with pytest.raises(RunNotFound):
        retry(run.pk, tenant_id="globex")
    assert retry(run.pk, tenant_id="acme").status == Status.PENDING


@pytest.mark.parametrize("bad_id", [999_999, "1; DROP TABLE x", None])
def test_unknown_ids_are_refused(bad_id: Any) -> None:
    with pytest.raises(RunNotFound):
        cancel(bad_id)
    with pytest.raises(RunNotFound):
        retry(bad_id)


def test_retry_puts_a_failed_run_back_with_fresh_attempts() -> None:
    run = JobRunFactory(status=Status.FAILED, attempts=3, max_attempts=3, error={"type": "X"})
    step = JobStepFactory(run=run)
    again = retry(run.pk)
    assert (again.status, again.attempts, again.finished_at) == (Status.PENDING, 0, None)
    assert JobStep.objects.filter(pk=step.pk).exists()
    retry_reset = JobRunFactory(status=Status.TIMED_OUT)
    JobStepFactory(run=retry_reset)
    retry(retry_reset.pk, reset_steps=True)
    assert not JobStep.objects.filter(run=retry_reset).exists()


@pytest.mark.parametrize("state", [Status.PENDING, Status.RUNNING, Status.COMPLETED])
def test_retry_refuses_runs_that_did_not_end_badly(state: str) -> None:
    run = JobRunFactory(status=state)
    with pytest.raises(InvalidTransition, match=state):
        retry(run.pk)


def test_signals_are_sent_for_each_transition(django_capture_on_commit_callbacks: Any) -> None:
    seen: list[tuple[str, int]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, run_id: int, **kwargs: Any) -> None:
            seen.append((name, run_id))

        return receive

    names = [
        "run_started",
        "run_completed",
        "run_failed",
        "run_retry_scheduled",
        "run_canceled",
        "step_completed",
    ]
    handlers = {name: receiver(name) for name in names}
    for name, fn in handlers.items():
        getattr(signals, name).connect(fn)
    try:
        flaky = start("tests.flaky", {"succeed_on": 2})
        failing = start("tests.permanent")
        stepped = start("tests.loop_steps")
        canceled = start("tests.noop", run_at=None)
        with django_capture_on_commit_callbacks(execute=True):
            cancel(canceled.pk)
        drain()
    finally:
        for name, fn in handlers.items():
            getattr(signals, name).disconnect(fn)
    assert ("run_retry_scheduled", flaky.pk) in seen
    assert ("run_completed", flaky.pk) in seen
    assert ("run_failed", failing.pk) in seen
    assert ("run_canceled", canceled.pk) in seen
    assert seen.count(("step_completed", stepped.pk)) == 3
    assert seen.count(("run_started", flaky.pk)) == 2


# --- a cancel request is not parked behind a suspension ----------------------------------


@pytest.mark.django_db
def test_a_cancel_requested_before_a_durable_sleep_is_not_deferred_until_it_wakes() -> None:
    run = start("tests.sleeper", {"seconds": 3600})
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert cancel(run.pk) == 1  # running: asked to cancel
    # The worker has not polled the request yet (it does so once per heartbeat).
    execute(claim)
    run.refresh_from_db()
    assert run.status == Status.CANCELED, (run.status, run.run_at)


@pytest.mark.django_db
def test_a_cancel_requested_before_wait_for_terminates_the_children() -> None:
    parent = start("tests.parent", {"n": 2})
    (claim,) = claiming.claim_batch(WorkerFactory().pk, ["default"], 1)
    assert cancel(parent.pk) == 1
    execute(claim)  # spawns two children, then wait_for() suspends
    parent.refresh_from_db()
    children = list(JobRun.objects.filter(parent=parent).values_list("status", flat=True))
    assert (parent.status, children) == (Status.CANCELED, [Status.CANCELED] * 2)


# --- cascade=False means the same thing for running and waiting runs ---------------------


@pytest.mark.django_db
def test_cancel_without_cascade_of_a_running_parent_leaves_its_children() -> None:
    start("tests.parent", {"n": 2})
    (claim,) = claiming.claim_batch(WorkerFactory().pk, ["default"], 1)
    child = JobContext(Attempt.of(claim)).spawn_child("tests.echo", {"i": 0})
    assert cancel(claim.run_id, cascade=False) == 1
    # A second execution under the same claim: it must look up the step just recorded.
    attempt = Attempt.of(dataclasses.replace(claim, has_steps=True))
    attempt.notice_cancel()  # the worker noticed the request; the next step raises JobCanceled
    assert execute(claim, attempt=attempt) is Outcome.CANCELED
    # A waiting parent canceled with cascade=False keeps its children; a running one
    # loses them when it ends canceled, because after_end() ignores the flag.
    assert status_of(child) == Status.PENDING
