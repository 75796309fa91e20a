"""Hostile input: each gets a clear error or is stored verbatim, and nothing is lost.

(The basic refusals of ``start()`` are in test_start.py; these add sizes,
depth, every text field, and the same checks through ``start_many()``.)
"""

from __future__ import annotations

from typing import Any

import pytest

from django_jobs import cancel, retry, start, start_many
from django_jobs.exceptions import InvalidJobInput, RunNotFound
from django_jobs.models import JobRun, Status
from django_jobs.testing import drain

pytestmark = pytest.mark.django_db

SQL = "x'); DROP TABLE django_jobs_jobrun; --"
# Pool names take no whitespace: the same SQL without it.
POOL_SQL = "".join(SQL.split())[:100]


def deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("item", "options", "message"),
    [
        ({"blob": "x" * 2_000_000}, {}, "MAX_INPUT_BYTES"),
        (deep(100_000), {}, "nested too deeply"),
        ({"bad": "\ud800"}, {}, "surrogate"),
        ({"nul": "a\x00b"}, {}, "NUL"),
        ({}, {"concurrency_key": "a\x00b"}, "NUL"),
        ({}, {"tags": ["ok", "a\x00b"]}, "NUL"),
        ({}, {"tenant_id": "t\x00"}, "NUL"),
        ({}, {"pool": "p\x00"}, "control character"),
        ({}, {"pool": "p q"}, "whitespace"),
        ({}, {"concurrency_key": "k" * 256}, "longer than 255"),
        ({}, {"tags": ["t" * 101]}, "longer than 100"),
        ({}, {"priority": -40_000}, "priority"),
        ({}, {"priority": True}, "priority"),
    ],
)
@pytest.mark.parametrize("bulk", [False, True])
def test_hostile_input_is_refused_with_a_clear_error_and_nothing_written(
    item: Any, options: dict[str, Any], message: str, bulk: bool
) -> None:
    def enqueue() -> object:
        if bulk:
            return start_many("tests.noop", [{}, item], **options)
        return start("tests.noop", item, **options)

    with pytest.raises(InvalidJobInput, match=message):
        enqueue()
    assert not JobRun.objects.exists()


def test_the_input_size_limit_is_a_setting(settings: Any) -> None:
    settings.DJANGO_JOBS = {**getattr(settings, "DJANGO_JOBS", {}), "MAX_INPUT_BYTES": 100}
    with pytest.raises(InvalidJobInput, match=r"MAX_INPUT_BYTES \(100\)"):
        start("tests.noop", {"text": "x" * 100})
    assert start("tests.noop", {"text": "x" * 10}).pk


def test_reasonably_deep_input_is_stored_and_read_back() -> None:
    from django_jobs.payloads import MAX_DEPTH

    value = deep(MAX_DEPTH - 1)  # with the object around it: MAX_DEPTH
    run = start("tests.echo", {"tree": value})
    run.refresh_from_db()
    assert run.input == {"tree": value}


def test_sql_looking_text_in_every_text_field_is_stored_verbatim() -> None:
    run = start(
        "tests.echo",
        {SQL: SQL},
        pool=POOL_SQL,
        concurrency_key=SQL,
        idempotency_key=SQL,
        tags=[SQL],
        tenant_id=SQL,
    )
    many = start_many("tests.echo", [{SQL: SQL}], pool=POOL_SQL, tags=[SQL], tenant_id=SQL)
    assert cancel(run.pk, reason=SQL) == 1
    for stored in JobRun.objects.filter(pk__in=[run.pk, many[0].pk]):
        assert stored.input == {SQL: SQL}
        assert (stored.pool, stored.tags, stored.tenant_id) == (POOL_SQL, [SQL], SQL)
    canceled = JobRun.objects.get(pk=run.pk)
    assert (canceled.concurrency_key, canceled.idempotency_key) == (SQL, SQL)
    assert (canceled.status, canceled.cancel_reason) == (Status.CANCELED, SQL)
    assert JobRun.objects.count() == 2


def test_an_output_over_the_size_limit_fails_its_run_without_retry(settings: Any) -> None:
    run = start("tests.echo", {"blob": "x" * 900})
    # The worker's limit is lower than the enqueuer's was: the echoed output is too big.
    settings.DJANGO_JOBS = {**getattr(settings, "DJANGO_JOBS", {}), "MAX_INPUT_BYTES": 500}
    drain()
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert "MAX_INPUT_BYTES" in run.error["message"]
    assert run.error["retryable"] is False


@pytest.mark.parametrize("bad_id", [-1, 2**63, 1.5, "7", [1], True])
def test_cancel_and_retry_refuse_ids_that_name_no_run(bad_id: Any) -> None:
    start("tests.noop")
    with pytest.raises(RunNotFound):
        cancel(bad_id)
    with pytest.raises(RunNotFound):
        retry(bad_id)
    assert JobRun.objects.get().status == Status.PENDING
