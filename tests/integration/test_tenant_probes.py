"""Another tenant's run costs what a missing run costs: the same statements, no payload read.

A caller scoped to a tenant must learn nothing of other tenants' runs, not even
from how long a refusal takes. So the statement that finds the run carries the
tenant as a condition (another tenant's row is neither locked nor loaded), and
no statement of a refused call reads a payload. Timing itself is not asserted
(machines are noisy); the statements are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobs import cancel, retry, start
from django_jobs.api import run_now
from django_jobs.exceptions import RunNotFound
from django_jobs.models import JobRun, Status
from tests.factories import JobRunFactory

pytestmark = pytest.mark.django_db(transaction=True)

BIG = {"blob": "x" * 900_000}
# A payload column named in a statement, whatever the database quotes names with.
PAYLOAD_COLUMN = re.compile(r"""[`"](input|output|error|progress)[`"]""")

OPERATIONS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "cancel": (Status.PENDING, lambda run_id: cancel(run_id, tenant_id="globex")),
    "retry": (Status.FAILED, lambda run_id: retry(run_id, tenant_id="globex")),
    "run_now": (Status.PENDING, lambda run_id: run_now(run_id, tenant_id="globex")),
    "start a child": (
        Status.RUNNING,
        lambda run_id: start("tests.noop", parent=run_id, tenant_id="globex"),
    ),
}


def statements(call: Callable[[], Any], run_id: int) -> tuple[str, list[str]]:
    """The refusal's message and the SQL it ran, with ``run_id`` written as ``<id>``."""
    with CaptureQueriesContext(connection) as queries, pytest.raises(RunNotFound) as refused:
        call()
    sql = [re.sub(rf"\b{run_id}\b", "<id>", query["sql"]) for query in queries.captured_queries]
    return str(refused.value).replace(str(run_id), "<id>"), sql


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_another_tenants_run_is_refused_by_the_statements_of_a_missing_one(
    operation: str,
) -> None:
    status, call = OPERATIONS[operation]
    # Ids no other number of a statement (a LIMIT) could be mistaken for.
    theirs = JobRunFactory(id=7_000_001, tenant_id="acme", status=status, input=BIG)
    missing = 7_000_777

    told_theirs, sql_theirs = statements(lambda: call(theirs.pk), theirs.pk)
    told_missing, sql_missing = statements(lambda: call(missing), missing)

    assert told_theirs == told_missing
    assert sql_theirs == sql_missing
    assert sql_theirs, "the run was looked up"
    for sql in sql_theirs:
        assert not PAYLOAD_COLUMN.search(sql), sql
    # The run's own statement names the tenant: the row is not locked first and checked after.
    finding = [sql for sql in sql_theirs if "<id>" in sql]
    assert finding
    assert all(re.search(r"WHERE.*tenant_id", sql) for sql in finding), finding
    # Nothing changed on the other tenant's run.
    after = JobRun.objects.get(pk=theirs.pk)
    assert (after.status, after.input, after.cancel_reason) == (status, BIG, "")


def test_a_tenants_own_run_is_still_found_and_returned_whole() -> None:
    mine = JobRunFactory(tenant_id="globex", status=Status.FAILED, input=BIG)
    retried = retry(mine.pk, tenant_id="globex")
    assert (retried.status, retried.input) == (Status.PENDING, BIG)
    assert cancel(mine.pk, tenant_id="globex") == 1
    assert JobRun.objects.get(pk=mine.pk).status == Status.CANCELED
