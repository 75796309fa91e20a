"""MySQL and MariaDB: what migration 0002 builds there, and the vendor module's statements.

These run where the suite's database is MySQL or MariaDB (``.ci/run`` runs the
suite on the machine's MariaDB); elsewhere they skip.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_jobs import start, start_many
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.retention import prune
from django_jobs.storage import claiming, leases, steps
from django_jobs.storage.vendors import mysql
from tests.factories import JobRunFactory, WorkerFactory

pytestmark = [
    pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL and MariaDB only"),
    pytest.mark.django_db,
]


def test_two_running_runs_of_one_key_are_refused_by_the_database() -> None:
    JobRunFactory(concurrency_key="acct:1", status=Status.RUNNING)
    JobRunFactory(concurrency_key="acct:1", status=Status.PENDING)  # pending: no conflict
    JobRunFactory(concurrency_key="ACCT:1", status=Status.RUNNING)  # another key
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRunFactory(concurrency_key="acct:1", status=Status.RUNNING)


def test_idempotency_keys_are_unique_per_job_type_and_tenant() -> None:
    JobRunFactory(idempotency_key="k")
    JobRunFactory(idempotency_key="k", job_type="tests.other")
    JobRunFactory(idempotency_key="k", tenant_id="acme")
    JobRunFactory(idempotency_key="K")  # keys compare byte for byte
    for tenant in (None, "acme"):
        with pytest.raises(IntegrityError), transaction.atomic():
            JobRunFactory(idempotency_key="k", tenant_id=tenant)


def test_start_with_a_key_returns_the_run_of_that_key_only() -> None:
    first = start("tests.noop", {}, idempotency_key="Order-1")
    assert start("tests.noop", {}, idempotency_key="Order-1").pk == first.pk
    assert start("tests.noop", {}, idempotency_key="order-1").pk != first.pk


def test_tenants_differing_in_case_or_trailing_space_are_apart() -> None:
    JobRunFactory(tenant_id="acme")
    assert not JobRun.objects.filter(tenant_id="ACME").exists()
    assert not JobRun.objects.filter(tenant_id="acme ").exists()


def _explain(query: Any) -> str:
    return str(query.explain())


def test_the_claim_reads_the_ready_index() -> None:
    JobRun.objects.bulk_create(
        JobRun(job_type="tests.noop", pool="default", status=Status.COMPLETED) for _ in range(500)
    )
    JobRun.objects.bulk_create(JobRun(job_type="tests.noop", pool="default") for _ in range(20))
    with transaction.atomic():
        plan = _explain(claiming.candidates(["default"], kind=False).values("id")[:10])
    assert "django_jobs_run_claim_kind" in plan


def test_worker_ids_grow_and_shrink_with_the_attempts() -> None:
    JobRunFactory()
    worker = WorkerFactory()
    (claim,) = claiming.claim_batch(worker.pk, None, 1)
    run = JobRun.objects.get(pk=claim.run_id)
    assert run.worker_ids == [str(worker.pk)]
    assert leases.release(worker.pk, [claim]) == 1
    assert JobRun.objects.get(pk=claim.run_id).worker_ids == []


def test_a_step_is_recorded_only_under_its_lease_and_a_completed_one_is_kept() -> None:
    JobRunFactory()
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert steps.record(claim, "Charge", 0, error={"type": "X", "message": "no"})
    assert steps.record(claim, "charge", 1, output={"id": 1})  # another step
    assert steps.record(claim, "Charge", 0, output={"id": 2})
    assert steps.record(claim, "Charge", 0, output={"id": 3})  # completed: kept
    recorded = {s.step_id: s for s in JobStep.objects.filter(run_id=claim.run_id)}
    assert (recorded["Charge"].status, recorded["Charge"].output) == ("completed", {"id": 2})
    assert recorded["Charge"].attempts == 2
    assert recorded["charge"].output == {"id": 1}
    JobRun.objects.filter(pk=claim.run_id).update(status=Status.PENDING, lease_token=None)
    assert not steps.record(claim, "late", 2, output=1)
    assert not JobStep.objects.filter(step_id="late").exists()


def test_prune_deletes_a_family_children_before_parents() -> None:
    long_ago = timezone.now() - timedelta(days=30)
    root = JobRunFactory(status=Status.COMPLETED, finished_at=long_ago)
    child = JobRunFactory(status=Status.COMPLETED, finished_at=long_ago, parent=root, root=root)
    JobRunFactory(
        status=Status.COMPLETED, finished_at=long_ago, parent=child, root=root
    )  # grandchild
    result = prune(timedelta(days=7))
    assert result.runs == 3
    assert not JobRun.objects.exists()


def test_named_key_locks_are_given_back_after_the_claim() -> None:
    JobRunFactory(concurrency_key="a")
    JobRunFactory(concurrency_key="b")
    claims = claiming.claim_batch(WorkerFactory().pk, None, 10)
    assert sorted(c.concurrency_key for c in claims) == ["a", "b"]
    name = mysql._lock_name(connection, "a")
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [name])
        assert cursor.fetchone()[0] is None


def test_start_many_without_insert_returning_writes_a_row_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MySQL cannot return the ids of a multi-row INSERT (MariaDB can): its path,
    # taken here on whichever of the two the suite runs on.
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)
    runs = start_many("tests.keyed", [{"key": "a"}, {"key": "b"}, {}])
    assert [run.pk for run in runs] == sorted(run.pk for run in runs)
    assert all(run.pk is not None for run in runs)
    stored = {run.pk: run.concurrency_key for run in JobRun.objects.all()}
    assert stored == {runs[0].pk: "a", runs[1].pk: "b", runs[2].pk: None}


def _indexes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT index_name FROM information_schema.statistics "
            "WHERE table_schema = DATABASE() AND table_name = 'django_jobs_jobrun'"
        )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_migration_0002_goes_back_and_forth() -> None:
    from django.core.management import call_command

    built = {
        "django_jobs_run_concurrency_slot",
        "django_jobs_run_idempotency",
        "django_jobs_run_claim_kind",
    }
    assert built <= _indexes()
    try:
        call_command("migrate", "django_jobs", "0001", verbosity=0)
        assert not built & _indexes()
        # Without 0002, nothing keeps two running runs of one key apart. (The
        # model as 0001 made it: later migrations' columns are gone too.)
        from django.db import connection
        from django.db.migrations.executor import MigrationExecutor

        state = MigrationExecutor(connection).loader.project_state(
            [("django_jobs", "0001_initial")]
        )
        old = state.apps.get_model("django_jobs", "JobRun")
        old.objects.create(job_type="tests.noop", concurrency_key="k", status=Status.RUNNING)
        old.objects.create(job_type="tests.noop", concurrency_key="k", status=Status.RUNNING)
        old.objects.all().delete()
    finally:
        call_command("migrate", "django_jobs", verbosity=0)
    assert built <= _indexes()


def test_completions_of_a_batch_are_written_where_their_lease_holds() -> None:
    start_many("tests.noop", [{}, {}, {}])
    worker = WorkerFactory()
    first, second, third = claiming.claim_batch(worker.pk, None, 3)
    # The third run was taken back and claimed again: its first lease is stale.
    JobRun.objects.filter(pk=third.run_id).update(status=Status.PENDING, lease_token=None)
    (again,) = claiming.claim_batch(worker.pk, None, 1)
    written = leases.complete_many(
        [(first, {"n": [1, {"ü": "😀"}]}), (second, None), (third, "late"), (again, "fresh")]
    )
    assert written == {
        (first.run_id, first.lease_token),
        (second.run_id, second.lease_token),
        (again.run_id, again.lease_token),
    }
    stored = {run.pk: (run.status, run.output, run.lease_token) for run in JobRun.objects.all()}
    assert stored == {
        first.run_id: (Status.COMPLETED, {"n": [1, {"ü": "😀"}]}, None),
        second.run_id: (Status.COMPLETED, None, None),
        third.run_id: (Status.COMPLETED, "fresh", None),
    }


def test_django_says_nothing_of_the_indexes_the_migration_builds() -> None:
    # models.W036, W037, W043 and (Django 6.1) W044: partial and expression
    # indexes and constraints, which migration 0002 and 0009 build another way.
    ids = [message.id for message in JobRun.check(databases=["default"])]
    assert not [i for i in ids if i and i.startswith("models.W")], ids
