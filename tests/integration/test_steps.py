"""Durable steps, replayed from JobStep rows (in-process with drain())."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_jobs import JobContext, RetryPolicy, job, retry, start
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.registry import unregister
from django_jobs.testing import drain
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def effects(run: JobRun, name: str) -> int:
    return Execution.objects.filter(run_id=run.pk, job_type=f"effect:{name}").count()


def test_completed_steps_are_not_run_again_on_retry() -> None:
    run = start("tests.three_steps", {"fail_c_until": 3})
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.COMPLETED, 3)
    assert (effects(run, "a"), effects(run, "b"), effects(run, "c-started"), effects(run, "c")) == (
        1,
        1,
        3,
        1,
    )
    steps = {s.step_id: s for s in JobStep.objects.filter(run=run)}
    assert [steps[k].seq for k in ("a", "b", "c")] == [1, 2, 3]
    assert steps["c"].attempts == 3
    assert steps["c"].status == "completed"
    assert run.output == {"a": steps["a"].output, "b": steps["b"].output, "c": steps["c"].output}


def test_a_step_in_a_loop_is_numbered_and_replays() -> None:
    run = start("tests.loop_steps")
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.COMPLETED, 2)
    assert effects(run, "send") == 3
    ids = list(JobStep.objects.filter(run=run).values_list("step_id", flat=True))
    assert ids == ["send", "send#2", "send#3"]
    assert run.output == list(JobStep.objects.filter(run=run).values_list("output", flat=True))


def test_atomic_step_is_exactly_once_after_a_retry() -> None:
    run = start("tests.atomic_step")
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.COMPLETED, 2)
    assert effects(run, "write") == 1


def test_atomic_step_that_raises_leaves_no_write_behind() -> None:
    run = start("tests.atomic_step_fails")
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.COMPLETED, 2)
    # Attempt 1 wrote its row and raised inside the transaction: rolled back.
    assert Execution.objects.filter(run_id=run.pk, job_type="effect:write").count() == 1
    assert Execution.objects.get(run_id=run.pk, job_type="effect:write").attempt == 2
    step = JobStep.objects.get(run=run)
    assert (step.status, step.attempts) == ("completed", 2)


def test_a_step_output_that_is_not_json_fails_the_run_naming_the_step() -> None:
    run = start("tests.bad_step")
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.FAILED, 1)
    assert "'unstorable'" in run.error["message"]
    assert run.error["type"] == "django_jobs.exceptions.InvalidStepOutput"
    step = JobStep.objects.get(run=run)
    assert step.status == "failed"
    assert step.error["type"] == "django_jobs.exceptions.InvalidStepOutput"


def test_retry_keeps_completed_steps_unless_reset() -> None:
    run = start("tests.three_steps", {"fail_c_until": 99})
    drain()
    assert JobRun.objects.get(pk=run.pk).status == Status.FAILED
    retry(run.pk)
    drain()
    assert (effects(run, "a"), effects(run, "c-started")) == (1, 6)
    retry(run.pk, reset_steps=True)
    drain()
    assert effects(run, "a") == 2


class Declined(Exception):
    """A card declined: running again cannot cure it."""


def charge(ctx: JobContext) -> None:
    def declined() -> None:
        raise (Declined if ctx.input["declined"] else RuntimeError)("card declined")

    ctx.step("charge", declined)


@pytest.fixture
def charging() -> Iterator[None]:
    policy = RetryPolicy(attempts=2, base_delay=0, jitter=False, non_retryable=[Declined])
    job("steps.charge", retry=policy)(charge)
    yield
    unregister("steps.charge")


@pytest.mark.usefixtures("charging")
@pytest.mark.parametrize(
    ("declined", "attempts", "retryable"), [(True, 1, False), (False, 2, True)]
)
def test_a_failed_step_says_retryable_as_its_run_does(
    declined: bool, attempts: int, retryable: bool
) -> None:
    run = start("steps.charge", {"declined": declined})
    drain()
    run.refresh_from_db()
    step = JobStep.objects.get(run=run)
    expected: dict[str, Any] = {"type": run.error["type"], "retryable": retryable}
    assert (run.status, run.attempts) == (Status.FAILED, attempts)
    assert {k: run.error[k] for k in expected} == expected
    assert {k: step.error[k] for k in expected} == expected
    assert step.error["attempt"] == run.error["attempt"] == attempts
