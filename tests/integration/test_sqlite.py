"""SQLite as the jobs database, in one process: the durable features under ``drain()``.

SQLite serves a project's own tests and development in one process (check
W001 warns of a second worker process). Steps are recorded by SQLite's own
statement (``storage/vendors/sqlite.py``); the rest is the portable forms.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from django_jobs import JobContext, RetryPolicy, cancel, job, retry, start
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.registry import unregister
from django_jobs.testing import drain
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(databases=["default", "sqlite"], transaction=True)

JOBS = (
    "sqlite.failing_step",
    "sqlite.steps",
    "sqlite.child",
    "sqlite.parent",
    "sqlite.parent_elsewhere",
    "sqlite.sleeper",
)


def runs() -> Any:
    return JobRun.objects.using("sqlite")


def run_of(run: JobRun) -> JobRun:
    return runs().get(pk=run.pk)


def _effect(ctx: JobContext) -> Execution:
    """A side effect, counted in the default database."""
    return Execution.objects.create(
        run_id=ctx.run_id, job_type=ctx.job_type, attempt=ctx.attempt, pid=0
    )


@pytest.fixture(autouse=True)
def on_sqlite() -> Iterator[None]:
    with override_settings(DJANGO_JOBS={"DATABASE": "sqlite"}):

        @job("sqlite.steps", retry=RetryPolicy(attempts=2, base_delay=0, jitter=False))
        def steps(ctx: JobContext) -> Any:
            first = ctx.step("first", lambda: _effect(ctx).pk)
            second = ctx.step("second", lambda: first + 1, atomic=True)
            if ctx.attempt == 1:
                raise ValueError("the first attempt fails after its steps")
            return {"first": first, "second": second}

        @job("sqlite.failing_step", retry=RetryPolicy(attempts=2, base_delay=0, jitter=False))
        def failing_step(ctx: JobContext) -> Any:
            def once() -> int:
                if ctx.attempt == 1:
                    raise ValueError("the step fails on the first attempt")
                return ctx.attempt

            return ctx.step("flaky", once)

        @job("sqlite.child")
        def child(ctx: JobContext) -> Any:
            return ctx.input["n"] * 2

        @job("sqlite.parent")
        def parent(ctx: JobContext) -> Any:
            kids = [ctx.spawn_child("sqlite.child", {"n": n}) for n in range(3)]
            return {"sum": sum(ctx.wait_for(kids))}

        @job("sqlite.parent_elsewhere")
        def parent_elsewhere(ctx: JobContext) -> Any:
            kids = [ctx.spawn_child("sqlite.child", {"n": n}, pool="later") for n in range(3)]
            return {"sum": sum(ctx.wait_for(kids))}

        @job("sqlite.sleeper")
        def sleeper(ctx: JobContext) -> Any:
            ctx.sleep("nap", timedelta(seconds=1.5))
            return "woke"

        try:
            yield
        finally:
            for name in JOBS:
                unregister(name)


def test_steps_are_recorded_once_and_replayed_on_the_next_attempt() -> None:
    run = start("sqlite.steps")
    assert drain() == 2  # the failed first attempt, then the retry
    done = run_of(run)
    assert done.status == Status.COMPLETED, done.error
    assert done.attempts == 2
    assert len(done.worker_ids) == 2
    # The first step's side effect happened once: the retry replayed its output.
    assert Execution.objects.filter(run_id=run.pk).count() == 1
    steps = JobStep.objects.using("sqlite").filter(run_id=run.pk).order_by("seq")
    assert [(s.step_id, s.status) for s in steps] == [
        ("first", "completed"),
        ("second", "completed"),
    ]
    assert done.output == {"first": steps[0].output, "second": steps[0].output + 1}


def test_a_failed_step_is_recorded_then_overwritten_by_its_success() -> None:
    run = start("sqlite.failing_step")
    drain()
    assert (run_of(run).status, run_of(run).output) == (Status.COMPLETED, 2)
    step = JobStep.objects.using("sqlite").get(run_id=run.pk)
    assert (step.step_id, step.status, step.attempts, step.output) == ("flaky", "completed", 2, 2)
    assert step.error is None


def test_children_are_started_once_and_awaited() -> None:
    run = start("sqlite.parent")
    drain()
    assert run_of(run).status == Status.COMPLETED
    assert run_of(run).output == {"sum": 6}
    assert runs().filter(parent_id=run.pk).count() == 3


def test_a_durable_sleep_waits_and_resumes_once_it_is_over() -> None:
    run = start("sqlite.sleeper")
    drain()
    assert run_of(run).status == Status.WAITING
    assert run_of(run).attempts == 0  # waiting gives the attempt back
    time.sleep(1.6)
    drain()  # wakes the sleeper, whose sleep is over, and runs it
    assert (run_of(run).status, run_of(run).output) == (Status.COMPLETED, "woke")


def test_cancel_cascades_and_retry_starts_over() -> None:
    run = start("sqlite.parent_elsewhere")
    drain("default")  # the parent only: it spawns its children and waits
    assert run_of(run).status == Status.WAITING
    assert cancel(run.pk) == 4  # the parent and its three pending children
    assert set(runs().values_list("status", flat=True)) == {Status.CANCELED}
    retry(run.pk, reset_steps=True)  # new children, not the canceled ones
    drain()
    assert (run_of(run).status, run_of(run).output) == (Status.COMPLETED, {"sum": 6})


def test_a_rate_limit_is_enforced_at_claim_on_sqlite_too() -> None:
    from django_jobs.models import JobRateLimit, Worker
    from django_jobs.ratelimits import Limits, Rate
    from django_jobs.storage import claiming

    for _ in range(4):
        start("tests.limited")
    worker = Worker.objects.using("sqlite").create(hostname="h", pid=1, concurrency=4)
    limits = Limits({"tests.limited": Rate(2, 3600.0)})
    first = claiming.claim_batch(worker.pk, None, 4, limits=limits)
    assert len(first) == 2
    assert claiming.claim_batch(worker.pk, None, 4, limits=limits) == []
    row = JobRateLimit.objects.using("sqlite").get(name="tests.limited")
    assert row.open_at is not None
    assert runs().filter(status=Status.PENDING).count() == 2


def test_runs_held_for_a_concurrency_key_are_released_on_sqlite_too() -> None:
    from django_jobs.storage import holds

    @job("sqlite.keyed", concurrency_key=lambda input: "one")
    def keyed(ctx: JobContext) -> Any:
        return ctx.input["n"]

    try:
        runs().create(job_type="sqlite.keyed", concurrency_key="one", status=Status.RUNNING)
        held = [start("sqlite.keyed", {"n": n}) for n in range(3)]
        assert {run_of(run).hold for run in held} == {"key"}
        assert drain() == 0
        runs().filter(status=Status.RUNNING).update(status=Status.COMPLETED)
        assert holds.release_stranded() == 1
        assert drain() == 3
        assert [run_of(run).output for run in held] == [0, 1, 2]
    finally:
        unregister("sqlite.keyed")


def test_a_concurrency_limit_is_enforced_and_its_held_runs_released_on_sqlite_too() -> None:
    from django_jobs.models import Worker
    from django_jobs.storage import claiming, holds

    @job("sqlite.limited", concurrency_key="two", concurrency_limit=2)
    def limited(ctx: JobContext) -> Any:
        return ctx.input["n"]

    try:
        worker = Worker.objects.using("sqlite").create(
            hostname="h", pid=1, pools=["default"], concurrency=4
        )
        started = [start("sqlite.limited", {"n": n}) for n in range(5)]
        assert len(claiming.claim_batch(worker.pk, ["default"], 5)) == 2
        assert claiming.claim_batch(worker.pk, ["default"], 5) == []
        assert sorted(
            runs().filter(status=Status.RUNNING).values_list("concurrency_slot", flat=True)
        ) == [0, 1]
        held = start("sqlite.limited", {"n": 5})
        assert run_of(held).hold == "key"
        runs().filter(status=Status.RUNNING).update(status=Status.COMPLETED, lease_token=None)
        # Three ready runs of the key fill its two slots: the held one waits.
        assert holds.release_stranded() == 0
        assert drain() == 4
        assert [run_of(run).output for run in [*started[2:], held]] == [2, 3, 4, 5]
    finally:
        unregister("sqlite.limited")
