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
