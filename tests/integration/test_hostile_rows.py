"""Hostile rows (issue 32 §5): one run row the worker cannot decode must not stop the others.

The database is trusted, but anyone who can write the table can store JSON that
Python cannot read: nested deeper than its recursion limit (PostgreSQL's jsonb
takes 10,000 levels), a number of more digits than ``int()`` converts, or, where
a CHECK constraint can be turned off (MariaDB, SQLite), text that is not JSON.
Such a run fails alone, not retried, with a stored error and one log line; the
runs claimed with it run, and the worker stays up.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from django_jobs import start
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.ratelimits import Limits, Rate
from django_jobs.storage import claiming, reading
from django_jobs.testing import drain
from django_jobs.worker import EXIT_OK, JobWorker
from tests.factories import JobRunFactory, WorkerFactory
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 10_000 + "]" * 10_000
HUGE_NUMBER = '{"n": 1' + "0" * 5_000 + "}"
NOT_JSON = '{"n": '
# Not every database stores every value: jsonb takes no text that is not JSON.
VALUES = {
    "deep": DEEP,
    "huge number": HUGE_NUMBER,
    "not json": NOT_JSON,
}


@contextmanager
def checks_off() -> Iterator[None]:
    """Let this connection store what the JSON columns' CHECK constraints refuse."""
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION check_constraint_checks = 0")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION check_constraint_checks = 1")
    elif connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA ignore_check_constraints = 1")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA ignore_check_constraints = 0")
    else:
        yield


def store(model: Any, pk: Any, column: str, text: str) -> None:
    """Write ``text`` into a JSON column as it is, past what the ORM would check."""
    if connection.vendor == "postgresql" and text == NOT_JSON:
        pytest.skip("jsonb stores JSON only")
    table = connection.ops.quote_name(model._meta.db_table)
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with checks_off(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name(column)} = %s{cast} WHERE id = %s",
            [text, pk],
        )
        assert cursor.rowcount == 1


def hostile_run(value: str, job_type: str = "tests.record", **fields: Any) -> JobRun:
    run = JobRunFactory(job_type=job_type, **fields)
    store(JobRun, run.pk, "input", value)
    return run


def unwritable(value: str) -> bool:
    """Whether the database refuses any change to a row holding ``value`` (MariaDB
    checks every JSON column's CHECK at each UPDATE; its JSON nests 32 deep at most)."""
    return connection.vendor == "mysql" and value in (DEEP, NOT_JSON)


@pytest.fixture(autouse=True)
def forget_unwritable_rows() -> Iterator[None]:
    yield
    reading._unwritable.clear()  # ids are used again by the next test's rows


@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("how", ["claim", "two statements", "rate-limited"])
def test_a_claim_hands_over_a_row_it_cannot_decode_marked_and_the_others_whole(
    value: str, how: str
) -> None:
    kwargs: dict[str, Any] = {}
    job_type = "tests.record"
    if how == "rate-limited":
        job_type = "tests.limited"
        kwargs["limits"] = Limits({job_type: Rate(100, 1.0)})
    good = [JobRunFactory(job_type=job_type, input={"n": n}) for n in range(3)]
    bad = hostile_run(VALUES[value], job_type)
    worker = WorkerFactory()
    if how == "two statements":
        claims = claiming.claim_two_statements(worker.pk, claiming.candidates(None), 10)
    else:
        claims = claiming.claim_batch(worker.pk, None, 10, **kwargs)
    by_id = {claim.run_id: claim for claim in claims}
    assert [by_id[run.pk].input for run in good] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(by_id[run.pk].unreadable is None for run in good)
    if unwritable(VALUES[value]):
        assert bad.pk not in by_id
        assert reading.passed_over() == [bad.pk]
        return
    assert set(by_id) == {run.pk for run in [*good, bad]}
    marked = by_id[bad.pk]
    assert marked.unreadable is not None
    assert "input" in marked.unreadable
    assert marked.input is None
    assert len(marked.unreadable) < 300  # says what is wrong, without the value


@pytest.mark.parametrize("value", list(VALUES))
def test_a_trace_context_that_cannot_be_decoded_is_ignored(value: str) -> None:
    run = JobRunFactory(job_type="tests.record", input={"x": 1})
    store(JobRun, run.pk, "trace_context", VALUES[value])
    claims = claiming.claim_batch(WorkerFactory().pk, None, 10)
    if unwritable(VALUES[value]):
        assert claims == []
        assert reading.passed_over() == [run.pk]
        return
    (claim,) = claims
    assert claim.unreadable is None
    assert claim.input == {"x": 1}
    assert not isinstance(claim.trace_context, dict)


@pytest.mark.parametrize("value", list(VALUES))
def test_a_run_read_back_after_a_lost_commit_is_marked_not_raised(value: str) -> None:
    token = uuid.uuid4()
    worker = WorkerFactory()
    run = JobRunFactory(status=Status.RUNNING, claimed_by=worker, lease_token=token, attempts=1)
    store(JobRun, run.pk, "input", VALUES[value])
    claiming._uncertain.append(token)
    try:
        claims = claiming.claim_batch(worker.pk, None, 10)
    finally:
        claiming._uncertain.clear()
    assert [(c.run_id, c.unreadable is not None) for c in claims] == [(run.pk, True)]


@pytest.mark.postgresql("timestamptz holds years Python's datetime does not")
@pytest.mark.parametrize(
    ("column", "instant"),
    [("run_at", "-infinity"), ("created_at", "infinity"), ("cancel_requested_at", "20000-01-01")],
)
def test_a_date_python_cannot_hold_marks_its_run_and_the_claim_goes_on(
    column: str, instant: str
) -> None:
    good = [JobRunFactory(input={"n": n}) for n in range(3)]
    bad = JobRunFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_jobs_jobrun SET {column} = %s::timestamptz WHERE id = %s",
            [instant, bad.pk],
        )
    for how in ("claim", "two statements"):
        worker = WorkerFactory()
        if how == "claim":
            claims = claiming.claim_batch(worker.pk, None, 10)
        else:
            JobRun.objects.filter(pk__in=[r.pk for r in [*good, bad]]).update(
                status=Status.PENDING, lease_token=None, claimed_by=None
            )
            claims = claiming.claim_two_statements(worker.pk, claiming.candidates(None), 10)
        by_id = {claim.run_id: claim for claim in claims}
        assert set(by_id) == {run.pk for run in [*good, bad]}, how
        assert all(by_id[run.pk].unreadable is None for run in good)
        assert "dates" in (by_id[bad.pk].unreadable or "")


def test_a_row_that_cannot_count_another_attempt_is_passed_over_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = [JobRunFactory() for _ in range(3)]
    bad = JobRunFactory()
    most = {"postgresql": 2**31 - 1, "mysql": 2**32 - 1}.get(connection.vendor)
    if most is None:
        pytest.skip("SQLite's integers do not overflow")
    JobRun.objects.filter(pk=bad.pk).update(attempts=most, max_attempts=most)
    worker = WorkerFactory()
    with caplog.at_level(logging.INFO):
        claims = claiming.claim_batch(worker.pk, None, 10)
        assert sorted(c.run_id for c in claims) == sorted(r.pk for r in good)
        JobRunFactory()
        assert len(claiming.claim_batch(worker.pk, None, 10)) == 1
    assert JobRun.objects.get(pk=bad.pk).status == Status.PENDING
    lines = [r for r in caplog.records if f"run={bad.pk} " in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.ERROR


def failed_alone(bad: JobRun, message: str) -> None:
    # Not the whole row: its input is what Python cannot read.
    row = JobRun.objects.filter(pk=bad.pk).values("status", "attempts", "error").get()
    assert (row["status"], row["attempts"]) == (Status.FAILED, 1)
    assert row["error"]["type"] == "django_jobs.exceptions.InvalidJobInput"
    assert message in row["error"]["message"]
    assert row["error"]["retryable"] is False
    assert not Execution.objects.filter(run_id=bad.pk).exists()  # the handler never ran


@pytest.mark.parametrize("value", list(VALUES))
def test_a_worker_fails_the_run_it_cannot_decode_alone_and_runs_the_rest(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = [start("tests.record", {"n": n}) for n in range(5)]
    # tests.flaky retries (3 attempts): an input that cannot be read is not retried.
    bad = hostile_run(VALUES[value], "tests.flaky")
    bad_async = hostile_run(VALUES[value], "tests.async_echo")
    worker = JobWorker(["default"], concurrency=4, burst=True, poll_interval=0.05)
    with caplog.at_level(logging.INFO):
        assert worker.run() == EXIT_OK
    assert JobRun.objects.filter(pk__in=[r.pk for r in good], status=Status.COMPLETED).count() == 5
    assert Execution.objects.filter(run_id__in=[r.pk for r in good]).count() == 5
    for run in (bad, bad_async):
        if unwritable(VALUES[value]):
            status = JobRun.objects.filter(pk=run.pk).values_list("status", flat=True).get()
            assert status == Status.PENDING  # passed over: nothing can change the row
        else:
            failed_alone(run, "input")
        lines = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and f"run={run.pk} " in r.getMessage()
        ]
        assert len(lines) == 1, [r.getMessage() for r in lines]


def test_drain_fails_the_run_it_cannot_decode_and_runs_the_rest() -> None:
    good = [start("tests.record", {"n": n}) for n in range(3)]
    bad = hostile_run(HUGE_NUMBER)
    assert drain() == 4
    assert JobRun.objects.filter(pk__in=[r.pk for r in good], status=Status.COMPLETED).count() == 3
    failed_alone(bad, "input")


@pytest.mark.parametrize("value", list(VALUES))
def test_a_recorded_step_that_cannot_be_decoded_fails_its_run_once_naming_the_step(
    value: str,
) -> None:
    run = start("tests.three_steps", {})
    other = start("tests.three_steps", {})
    step = JobStep.objects.create(run=run, step_id="b", seq=2, status="completed", output=1)
    store(JobStep, step.pk, "output", VALUES[value])
    JobStep.objects.create(run=other, step_id="a", seq=1, status="completed", output=7)
    drain()
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.attempts == 1  # three_steps retries: a step that cannot be read is not
    assert run.error["type"] == "django_jobs.exceptions.InvalidStepOutput"
    assert "'b'" in run.error["message"]
    assert run.error["retryable"] is False
    other.refresh_from_db()
    assert other.status == Status.COMPLETED
    assert other.output["a"] == 7


def test_a_limit_row_whose_starts_cannot_be_decoded_does_not_stop_its_claims() -> None:
    """Its starts are dropped, as malformed entries are: the window is judged empty."""
    from django_jobs.models import JobRateLimit
    from django_jobs.ratelimits import Limits, Rate

    row = JobRateLimit.objects.create(scope="job", name="tests.limited", limit=2, period=3600.0)
    store(JobRateLimit, row.pk, "starts", HUGE_NUMBER.replace('{"n": ', "[[").replace("}", ", 1]]"))
    runs = [JobRunFactory(job_type="tests.limited") for _ in range(3)]
    limits = Limits({"tests.limited": Rate(2, 3600.0)})
    claims = claiming.claim_batch(WorkerFactory().pk, None, 10, limits=limits)
    assert sorted(c.run_id for c in claims) == [run.pk for run in runs[:2]]
    row.refresh_from_db()
    assert len(row.starts) == 1  # the new starts, as one entry
