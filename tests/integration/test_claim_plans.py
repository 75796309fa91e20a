"""The claim's prepared statement: planned once per connection, afresh after an idle spell."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from django_jobs import start_many
from django_jobs.models import JobRun, Status
from django_jobs.storage import claiming
from django_jobs.storage.claiming import Claim
from django_jobs.worker import JobWorker
from tests.factories import WorkerFactory
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.postgresql("prepared statements")
def test_the_claim_is_planned_once_per_connection() -> None:
    start_many("tests.noop", [{} for _ in range(12)])
    worker = WorkerFactory().pk
    for _ in range(12):
        assert len(claiming.claim_batch(worker, ["default"], 1)) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%FOR UPDATE SKIP LOCKED%%'"
        )
        ((generic, custom),) = cursor.fetchall()
    # The server plans custom five times, then keeps the cached generic plan.
    assert generic >= 6
    assert custom <= 5


def test_the_worker_plans_its_claim_afresh_when_runs_come_after_an_idle_spell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A generic plan made while the table was empty stays in use until the next
    # ANALYZE; a burst of runs must be claimed with a plan made for it.
    seen: list[tuple[int, int]] = []
    real = claiming.claim_batch

    def recording(*args: Any, plan: int = 0, **kwargs: Any) -> list[Claim]:
        batch = real(*args, plan=plan, **kwargs)
        if not kwargs.get("kind"):  # the threads' (each kind has its plans)
            seen.append((plan, len(batch)))
        return batch

    monkeypatch.setattr("django_jobs.claimer.claim_batch", recording)
    worker = JobWorker(["default"], concurrency=4, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: len(seen) >= 3, timeout=10)  # idle claims
        start_many("tests.noop", [{} for _ in range(20)])
        wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == 20)
    finally:
        worker.request_stop()
        thread.join(30)
        connections.close_all()
    first_busy = next(i for i, (_, size) in enumerate(seen) if size)
    idle_plan = seen[first_busy][0]
    assert all(plan == idle_plan for plan, _ in seen[:first_busy])
    assert seen[first_busy + 1][0] == idle_plan + 1


@pytest.mark.postgresql("prepared statements")
def test_a_statement_past_psycopgs_cache_is_turned_once_and_prepared_alike() -> None:
    """psycopg remembers the $n form of statements of 4,096 characters at most; the
    vendor turns longer ones (a claim under caps or limits) itself, %% included."""
    from django_jobs.storage.vendors import postgresql

    padding = "/* " + "x" * 5000 + " */"
    statement = f"SELECT %s::int, '50%%' || %s::text, 'a%%s' {padding}"
    vendor = postgresql.PostgreSQL()
    for n in range(3):
        assert vendor.fetch(connection, statement, [n, "!"]) == [(n, "50%!", "a%s")]
    assert postgresql._numbered(statement).startswith("SELECT $1::int, '50%' || $2::text, 'a%s'")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["SELECT $1::int, '50%%' || $2::text%"],
        )
        assert cursor.fetchone() == (1,)


@pytest.mark.postgresql("prepared statements")
def test_a_claim_under_tenant_caps_and_for_two_pools_goes_through_the_raw_cursor(
    settings: Any,
) -> None:
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "TENANT_CONCURRENCY": 2}
    start_many("tests.noop", [{} for _ in range(6)], tenant_id="t")
    start_many("tests.noop", [{} for _ in range(2)], pool="other")
    worker = WorkerFactory().pk
    claims = claiming.claim_batch(worker, ["default", "other"], 8)
    # Two of the tenant's (its cap) and the other pool's two.
    assert sorted(c.pool for c in claims) == ["default", "default", "other", "other"]
    assert getattr(connection, "_django_jobs_raw_cursor", None) is not None
