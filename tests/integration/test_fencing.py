"""Step writes and child spawns are fenced on the run's lease, like outcome writes."""

from __future__ import annotations

import uuid

import pytest

from django_jobs import start
from django_jobs.attempt import Attempt
from django_jobs.context import JobContext, LeaseLost
from django_jobs.execution import Outcome, execute
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.storage import claiming
from django_jobs.storage.claiming import Claim
from tests.factories import WorkerFactory

pytestmark = pytest.mark.django_db


def claimed_context(job_type: str = "tests.noop") -> JobContext:
    start(job_type)
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    return JobContext(Attempt.of(claim))


def replay_of(ctx: JobContext) -> JobContext:
    """A later execution of the run: its claim knows that steps were recorded."""
    run = JobRun.objects.get(pk=ctx.run_id)
    assert run.lease_token is not None
    claim = Claim(
        run_id=run.pk,
        attempt=run.attempts,
        lease_token=run.lease_token,
        job_type=run.job_type,
        has_steps=True,
    )
    return JobContext(Attempt.of(claim))


def steal(ctx: JobContext) -> None:
    """Another worker rescued and re-claimed the run: the lease token changed."""
    JobRun.objects.filter(pk=ctx.run_id).update(lease_token=uuid.uuid4())


def test_a_step_after_the_lease_changed_records_nothing() -> None:
    ctx = claimed_context()
    assert ctx.step("first", lambda: 1) == 1
    steal(ctx)
    with pytest.raises(LeaseLost):
        ctx.step("second", lambda: 2)
    assert list(JobStep.objects.values_list("step_id", flat=True)) == ["first"]


def test_an_atomic_step_after_the_lease_changed_rolls_its_writes_back() -> None:
    ctx = claimed_context()
    steal(ctx)
    with pytest.raises(LeaseLost):
        ctx.step("write", lambda: start("tests.echo", {"side": "effect"}).pk, atomic=True)
    assert not JobRun.objects.filter(job_type="tests.echo").exists()
    assert not JobStep.objects.exists()


def test_a_spawn_after_the_lease_changed_creates_no_child() -> None:
    ctx = claimed_context()
    steal(ctx)
    with pytest.raises(LeaseLost):
        ctx.spawn_child("tests.echo", {})
    assert not JobRun.objects.filter(parent_id=ctx.run_id).exists()


def test_a_replayed_spawn_returns_the_same_child() -> None:
    ctx = claimed_context()
    first = ctx.spawn_child("tests.echo", {"n": 1})
    replay = replay_of(ctx)
    assert replay.spawn_child("tests.echo", {"n": 1}).pk == first.pk
    assert JobRun.objects.filter(parent_id=ctx.run_id).count() == 1


def test_a_handler_whose_lease_is_lost_mid_run_ends_lost() -> None:
    start("tests.three_steps")
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    JobRun.objects.filter(pk=claim.run_id).update(status=Status.CANCELED, lease_token=None)
    assert execute(claim) is Outcome.LOST
    assert not JobStep.objects.exists()


def test_idempotency_keys_are_stable_and_distinct_per_occurrence() -> None:
    ctx = claimed_context()
    keys = [ctx.step("send", lambda: ctx.idempotency_key("send")) for _ in range(3)]
    assert keys == [f"django_jobs:{ctx.run_id}:send{suffix}" for suffix in ("", "#2", "#3")]
    replay = replay_of(ctx)
    assert [replay.step("send", lambda: "not called") for _ in range(3)] == keys
