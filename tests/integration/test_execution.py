"""One claimed run executed and its outcome recorded (in this process)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobs import JobContext, RetryPolicy, job, start
from django_jobs.execution import Outcome, execute
from django_jobs.models import JobRun, Status
from django_jobs.storage import claiming, leases
from django_jobs.storage.claiming import Claim
from django_jobs.testing import drain
from tests.factories import JobRunFactory, WorkerFactory
from tests.helpers import status_of
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def run_once(job_type: str, input: dict[str, object] | None = None) -> tuple[Outcome, JobRun]:
    run = start(job_type, input)
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert claim.run_id == run.pk
    outcome = execute(claim)
    run.refresh_from_db()
    return outcome, run


def test_success_stores_the_output() -> None:
    outcome, run = run_once("tests.echo", {"hello": ["world"]})
    assert outcome is Outcome.COMPLETED
    assert (run.status, run.output, run.error, run.attempts) == (
        Status.COMPLETED,
        {"hello": ["world"]},
        None,
        1,
    )
    assert run.finished_at is not None


def test_failure_with_attempts_left_is_rescheduled_with_backoff() -> None:
    before = timezone.now()
    outcome, run = run_once("tests.backoff")
    assert outcome is Outcome.RETRY
    assert (run.status, run.attempts, run.lease_token, run.claimed_by_id) == (
        Status.PENDING,
        1,
        None,
        None,
    )
    assert run.run_at >= before + timedelta(minutes=59)
    assert run.error["type"] == "builtins.RuntimeError"
    assert run.error["message"] == "try again in an hour"
    assert run.error["attempt"] == 1
    assert "Traceback" in run.error["traceback"]
    assert run.error["retryable"] is True


def test_failure_without_a_policy_fails_for_good() -> None:
    outcome, run = run_once("tests.system_exit")
    assert outcome is Outcome.FAILED
    assert run.status == Status.FAILED
    assert run.error["type"] == "builtins.SystemExit"
    assert run.finished_at is not None


@pytest.mark.parametrize("coded", [False, True])
def test_non_retryable_error_fails_at_once(coded: bool) -> None:
    outcome, run = run_once("tests.permanent", {"coded": coded})
    assert outcome is Outcome.FAILED
    assert (run.status, run.attempts, run.max_attempts) == (Status.FAILED, 1, 5)
    assert run.error["retryable"] is False


def test_output_that_is_not_json_fails_the_run() -> None:
    outcome, run = run_once("tests.bad_output")
    assert outcome is Outcome.FAILED
    assert run.status == Status.FAILED
    assert "not JSON-serializable" in run.error["message"]
    assert run.output is None


def test_unknown_job_type_at_the_worker_fails_clearly() -> None:
    JobRunFactory(job_type="removed.handler")
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert execute(claim) is Outcome.FAILED
    run = JobRun.objects.get(pk=claim.run_id)
    assert run.status == Status.FAILED
    assert "removed.handler" in run.error["message"]


def test_lost_lease_is_reported_and_nothing_written() -> None:
    start("tests.echo", {"a": 1})
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    JobRun.objects.filter(pk=claim.run_id).update(status=Status.CANCELED, lease_token=None)
    assert execute(claim) is Outcome.LOST
    assert JobRun.objects.get(pk=claim.run_id).output is None


def test_drain_runs_everything_due_including_immediate_retries() -> None:
    start("tests.flaky", {"succeed_on": 3})
    start("tests.echo", {"x": 1})
    start("tests.noop", run_at=timezone.now() + timedelta(hours=1))
    assert drain() == 4  # flaky runs three times
    statuses = dict(JobRun.objects.values_list("job_type", "status"))
    assert statuses == {
        "tests.flaky": Status.COMPLETED,
        "tests.echo": Status.COMPLETED,
        "tests.noop": Status.PENDING,
    }
    assert JobRun.objects.get(job_type="tests.flaky").attempts == 3
    assert Execution.objects.filter(job_type="tests.flaky").count() == 3


def test_drain_of_one_pool_leaves_the_others() -> None:
    start("tests.echo", {})
    start("tests.noop")
    assert drain("echo") == 1
    assert JobRun.objects.get(job_type="tests.noop").status == Status.PENDING


@pytest.mark.parametrize(("stored", "attempts"), [(1, 1), (2, 2), (5, 5)])
def test_the_attempts_stored_at_enqueue_bound_the_retries(stored: int, attempts: int) -> None:
    # tests.flaky's policy says 3 attempts; a run enqueued under another policy keeps its own.
    run = start("tests.flaky")
    JobRun.objects.filter(pk=run.pk).update(max_attempts=stored)
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.FAILED, attempts)


def _claimed_child() -> tuple[JobRun, Claim]:
    """A waiting parent and its only child, claimed."""
    parent = JobRunFactory(status=Status.WAITING, job_type="tests.parent")
    child = JobRunFactory(job_type="tests.noop", parent=parent, root=parent)
    JobRun.objects.filter(pk=parent.pk).update(awaiting=[child.pk])
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert claim.run_id == child.pk
    return parent, claim


def test_a_child_ended_by_the_executors_last_resort_wakes_its_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_jobs import execution

    parent, claim = _claimed_child()

    def broken(*args: object) -> Outcome:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(execution, "decide", broken)
    assert execute(claim) == Outcome.FAILED
    child = JobRun.objects.get(pk=claim.run_id)
    assert (child.status, child.error["type"]) == (
        Status.FAILED,
        "django_jobs.exceptions.ExecutionError",
    )
    assert JobRun.objects.get(pk=parent.pk).status == Status.PENDING


@pytest.mark.parametrize("refusals", [1, 2])
def test_a_child_whose_outcome_the_database_refuses_still_wakes_its_parent(
    monkeypatch: pytest.MonkeyPatch, refusals: int
) -> None:
    from django.db import DatabaseError

    parent, claim = _claimed_child()
    real_end = leases.end
    calls = {"end": 0}

    def refuse_complete(*args: object) -> bool:
        raise DatabaseError("value too long for type character varying(10)")

    def refuse_end(*args: object, **kwargs: object) -> bool:
        calls["end"] += 1
        if calls["end"] <= refusals:
            raise DatabaseError("refused again")
        return real_end(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(leases, "complete", refuse_complete)
    monkeypatch.setattr(leases, "end", refuse_end)
    assert execute(claim) == Outcome.FAILED
    assert JobRun.objects.get(pk=claim.run_id).status == Status.FAILED
    assert JobRun.objects.get(pk=parent.pk).status == Status.PENDING


# --- a run always ends, whatever its handler raises --------------------------------------


class UnprintableError(Exception):
    """An exception whose message cannot be rendered (a buggy third-party exception)."""

    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


@job("review.unprintable_error")
def unprintable_error(ctx: JobContext) -> None:
    raise UnprintableError()


@job("review.nul_error", retry=RetryPolicy(attempts=3, base_delay=0, jitter=False))
def nul_error(ctx: JobContext) -> None:
    raise RuntimeError("bad byte \x00 in a message from a C library")


@pytest.mark.django_db
def test_an_exception_whose_str_raises_still_ends_the_run() -> None:
    run = start("review.unprintable_error")
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    try:
        execute(claim)  # documented: "Never raises for the run"
    except Exception as exc:
        pytest.fail(f"execute() raised {exc!r}; run left {status_of(run)}")
    assert status_of(run) == Status.FAILED


@pytest.mark.django_db(transaction=True)
def test_a_retryable_error_with_a_nul_in_its_message_is_retried() -> None:
    run = start("review.nul_error")
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    execute(claim)
    run.refresh_from_db()
    assert run.status == Status.PENDING, run.error["message"]
    assert run.error["type"] == "builtins.RuntimeError"
