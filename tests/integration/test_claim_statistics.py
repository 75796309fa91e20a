"""The claim and the completion read what they take, whatever ANALYZE last saw.

Autovacuum analyzes a queue table whenever it likes, often when it is nearly
empty. The worst statistics are fixed here: taken with one pending run, kept
(no automatic analyze) while 20,000 more arrive. A plan made on them must still
read the runs it claims and completes, not the pending set once per claimed run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from django_jobs import start_many
from django_jobs.models import JobRun
from django_jobs.ratelimits import Limits, Rate
from django_jobs.storage import claiming, leases, turns, vendors
from tests.factories import WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)

QUEUED = 20_000
BATCH = 16
# Rows one claim or completion of 16 may read: the 16, their steps' index, the
# pools table, the index pages around them. A scan of the pending set per
# claimed run reads QUEUED * BATCH.
BUDGET = 1_000


@pytest.fixture
def worst_statistics() -> Iterator[None]:
    table = JobRun._meta.db_table
    keep, restore = {
        "postgresql": (
            f"ALTER TABLE {table} SET (autovacuum_enabled = false)",
            f"ALTER TABLE {table} RESET (autovacuum_enabled)",
        ),
        "mysql": (
            f"ALTER TABLE {table} STATS_AUTO_RECALC = 0",
            f"ALTER TABLE {table} STATS_AUTO_RECALC = DEFAULT",
        ),
    }.get(connection.vendor, ("SELECT 1", "SELECT 1"))
    with connection.cursor() as cursor:
        cursor.execute(keep)
        start_many("tests.noop", [{}])
        cursor.execute(f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}{table}")
    start_many("tests.noop", [{} for _ in range(QUEUED)])
    yield
    with connection.cursor() as cursor:
        cursor.execute(restore)


def _rows_read(node: dict[str, Any]) -> int:
    """The rows every scan of a PostgreSQL plan read, over all its loops."""
    total = 0
    if "Scan" in node["Node Type"]:
        rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        total += rows * node.get("Actual Loops", 1)
    return total + sum(_rows_read(child) for child in node.get("Plans", []))


def _explained(statement: str, params: Any) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        (plan,) = cursor.fetchone()
        transaction.set_rollback(True)
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return _rows_read(plan[0]["Plan"])


def record_statements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The statements (and parameters) the vendor's ``fetch`` runs from now on."""
    seen: list[tuple[str, Any]] = []
    vendor = type(vendors.of(connection))
    real = vendor.fetch

    def recording(self: Any, conn: Any, sql: str, params: Any) -> Any:
        seen.append((sql, params))
        return real(self, conn, sql, params)

    monkeypatch.setattr(vendor, "fetch", recording)
    return seen


@pytest.mark.postgresql("EXPLAIN ANALYZE of the one-statement claim")
@pytest.mark.parametrize("limited", [False, True], ids=["plain", "under rate limits"])
@pytest.mark.parametrize("kind", [False, None], ids=["threads", "both kinds"])
@pytest.mark.usefixtures("worst_statistics")
def test_postgresql_plans_read_what_they_take(
    monkeypatch: pytest.MonkeyPatch, limited: bool, kind: bool | None
) -> None:
    seen = record_statements(monkeypatch)
    limits = Limits({"tests.other": Rate(1, 60.0)}) if limited else None
    worker = WorkerFactory().pk
    claims = claiming.claim_batch(worker, ["default"], BATCH, kind=kind, limits=limits)
    assert len(claims) == BATCH
    (claim,) = [(sql, params) for sql, params in seen if "django_jobs claim" in sql]
    assert _explained(*claim) < BUDGET
    seen.clear()
    assert len(leases.complete_many([(claim, None) for claim in claims])) == BATCH
    (completion,) = seen
    # Explained after the fact: the runs are completed, the plan is the same.
    assert _explained(*completion) < BUDGET


@pytest.mark.postgresql("EXPLAIN ANALYZE of the turn a start takes")
@pytest.mark.usefixtures("worst_statistics")
def test_postgresql_a_start_reads_its_turn_from_the_indexes() -> None:
    # The 20,000 queued runs are of no tenant: the head and the last turn of that
    # group are both among them.
    assert _explained(*turns.turn_query("default", False, 0, None)) < BUDGET
    assert _explained(*turns.turn_query("default", False, 0, "other")) < BUDGET


def _handler_reads() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(value) for _, value in cursor.fetchall())


@pytest.mark.parametrize("kind", [False, None], ids=["threads", "both kinds"])
@pytest.mark.usefixtures("worst_statistics")
def test_mysql_claims_and_completions_read_what_they_take(kind: bool | None) -> None:
    if connection.vendor != "mysql":
        pytest.skip("MySQL and MariaDB count the rows a session read (Handler_read_*)")
    worker = WorkerFactory().pk
    before = _handler_reads()
    claims = claiming.claim_batch(worker, ["default"], BATCH, kind=kind)
    assert len(claims) == BATCH
    claimed = _handler_reads()
    assert claimed - before < BUDGET
    assert len(leases.complete_many([(claim, None) for claim in claims])) == BATCH
    completed = _handler_reads()
    assert completed - claimed < BUDGET
    # The turn a start takes: two probes of an index each.
    with connection.cursor() as cursor:
        cursor.execute(*turns.turn_query("default", False, 0, None))
    assert _handler_reads() - completed < BUDGET
