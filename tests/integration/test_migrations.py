from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree() -> None:
    out = StringIO()
    call_command("makemigrations", "django_jobs", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_code_from_before_a_new_column_can_still_insert_runs() -> None:
    """A rolling deploy migrates first, while processes of the previous release
    still insert runs without naming the new columns: those need database defaults."""
    from django.db import connection

    from django_jobs.models import JobRun

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_jobs_jobrun (job_type, pool, status, priority, attempts, "
            "max_attempts, input, tags, trigger_source, trigger_ref, close_policy, "
            "cancel_reason, cancel_cascade) VALUES ('tests.noop', 'default', 'pending', 0, 0, "
            "1, '{}', '[]', 'api', '', 'terminate', '', true) RETURNING id"
        )
        (run_id,) = cursor.fetchone()
    assert JobRun.objects.get(pk=run_id).worker_ids == []


@pytest.mark.django_db(transaction=True)
def test_0007_gives_unfinished_runs_an_entry_per_counted_attempt() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("django_jobs", "0006_lean_indexes"), ("django_jobs", "0007_attempt_workers")
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes("django_jobs")
    executor.migrate([before])
    try:
        old = executor.loader.project_state([before]).apps.get_model("django_jobs", "JobRun")
        retrying = old.objects.create(job_type="tests.noop", status="pending", attempts=2)
        done = old.objects.create(job_type="tests.noop", status="completed", attempts=1)
        executor = MigrationExecutor(connection)
        executor.migrate([after])
        new = executor.loader.project_state([after]).apps.get_model("django_jobs", "JobRun")
        assert new.objects.get(pk=retrying.pk).worker_ids == [None, None]
        assert new.objects.get(pk=done.pk).worker_ids == []
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)


def _finished_index() -> tuple[bool, str] | None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'django_jobs_run_finished'"
        )
        row = cursor.fetchone()
    return None if row is None else (bool(row[0]), str(row[1]))


@pytest.mark.django_db(transaction=True)
def test_0010_builds_the_index_again_over_an_invalid_one_a_failed_build_left() -> None:
    """A failed CREATE INDEX CONCURRENTLY leaves an invalid index behind; running
    migrate again must replace it, not fail on the name."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("django_jobs", "0009_schedules"), ("django_jobs", "0010_finished_index")
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes("django_jobs")
    executor.migrate([before])
    try:
        assert _finished_index() is None
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_jobs_jobrun (job_type, pool, status, priority, attempts,"
                " max_attempts, input, tags, trigger_source, trigger_ref, close_policy,"
                " cancel_reason, cancel_cascade) SELECT 'tests.noop', 'default', 'pending', 0, 0,"
                " 1, '{}', '[]', 'api', '', 'terminate', '', true FROM generate_series(1, 2)"
            )
            # A unique build over duplicate rows fails and leaves its index invalid.
            with pytest.raises(Exception, match="could not create unique index"):
                cursor.execute(
                    "CREATE UNIQUE INDEX CONCURRENTLY django_jobs_run_finished"
                    " ON django_jobs_jobrun (job_type)"
                )
        left = _finished_index()
        assert left is not None
        assert not left[0]
        executor = MigrationExecutor(connection)
        executor.migrate([after])
        built = _finished_index()
        assert built is not None
        assert built[0]
        assert "(finished_at) WHERE (finished_at IS NOT NULL)" in built[1]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)


@pytest.mark.django_db(transaction=True)
def test_0011_keeps_keyed_runs_and_scopes_keys_by_tenant() -> None:
    from django.db import IntegrityError, connection, transaction
    from django.db.migrations.executor import MigrationExecutor

    before = ("django_jobs", "0010_finished_index")
    after = ("django_jobs", "0011_idempotency_per_tenant")
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes("django_jobs")
    executor.migrate([before])
    try:
        old = executor.loader.project_state([before]).apps.get_model("django_jobs", "JobRun")
        kept = [
            old.objects.create(job_type="tests.noop", idempotency_key="k1", tenant_id="acme"),
            old.objects.create(job_type="tests.noop", idempotency_key="k2"),
        ]
        executor = MigrationExecutor(connection)
        executor.migrate([after])
        new = executor.loader.project_state([after]).apps.get_model("django_jobs", "JobRun")
        assert set(new.objects.values_list("pk", flat=True)) == {run.pk for run in kept}
        # Another tenant may now use acme's key; the same tenant (or none) may not.
        new.objects.create(job_type="tests.noop", idempotency_key="k1", tenant_id="globex")
        new.objects.create(job_type="tests.noop", idempotency_key="k1")
        for tenant in ("acme", "globex", None):
            with pytest.raises(IntegrityError), transaction.atomic():
                new.objects.create(job_type="tests.noop", idempotency_key="k1", tenant_id=tenant)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)
