from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import override_settings


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


CHAIN = "tests.migration_chain"  # the migrations 0001-0011 squashed into 0001_initial


@pytest.fixture
def chain(transactional_db: None) -> Iterator[BaseDatabaseWrapper]:
    """A scratch database of its own, migrated with the chain of the migrations
    squashed into 0001_initial (as databases made before the squash were)."""
    from django.db import connection, connections

    if connection.vendor != "postgresql":
        pytest.skip("the old chain's migrations are checked on PostgreSQL")
    name = f"{connection.settings_dict['NAME']}_chain"[:63]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    # An alias of its own (RunPython operations look their database up by alias),
    # added once the test case is set up, which forbids aliases it does not know.
    connections.settings["chain"] = {**connection.settings_dict, "NAME": name}
    wrapper = connections["chain"]
    wrapper.connect()  # the test case refuses to open connections it was not told of
    try:
        with override_settings(MIGRATION_MODULES={"django_jobs": CHAIN}):
            yield wrapper
    finally:
        wrapper.close()
        del connections["chain"]
        del connections.settings["chain"]
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')


SCHEMA = """
SELECT 'column', table_name || '.' || column_name,
       concat_ws(' ', data_type, character_maximum_length, is_nullable, column_default, is_identity)
  FROM information_schema.columns
 WHERE table_schema = current_schema() AND table_name LIKE 'django_jobs%%'
UNION ALL
SELECT 'index', indexname, indexdef FROM pg_indexes
 WHERE schemaname = current_schema() AND tablename LIKE 'django_jobs%%'
UNION ALL
SELECT 'constraint', c.conname, pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
 WHERE t.relname LIKE 'django_jobs%%'
UNION ALL
SELECT 'trigger', t.tgname, pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid
 WHERE r.relname LIKE 'django_jobs%%' AND NOT t.tgisinternal
UNION ALL
SELECT 'function', proname, md5(prosrc) FROM pg_proc WHERE proname LIKE 'django_jobs%%'
"""


def _schema(connection: BaseDatabaseWrapper) -> set[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(SCHEMA)
        return {tuple(row) for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_squashed_initial_migration_makes_the_schema_the_old_chain_made(
    chain: BaseDatabaseWrapper,
) -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(chain)
    assert len(executor.loader.graph.leaf_nodes("django_jobs")) == 1
    assert ("django_jobs", "0011_idempotency_per_tenant") in executor.loader.graph.nodes
    executor.migrate(executor.loader.graph.leaf_nodes("django_jobs"))
    # Then the migrations after the squashed 0001_initial, as such a database gets them.
    with override_settings(MIGRATION_MODULES={}):
        executor = MigrationExecutor(chain)
        executor.migrate(executor.loader.graph.leaf_nodes("django_jobs"))
    old, new = _schema(chain), _schema(connection)
    assert any(kind == "trigger" for kind, _, _ in new)
    assert sorted(old - new) == []
    assert sorted(new - old) == []


@pytest.mark.django_db(transaction=True)
def test_0007_gives_unfinished_runs_an_entry_per_counted_attempt(
    chain: BaseDatabaseWrapper,
) -> None:
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("django_jobs", "0006_lean_indexes"), ("django_jobs", "0007_attempt_workers")
    executor = MigrationExecutor(chain)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps.get_model("django_jobs", "JobRun")
    retrying = old.objects.using("chain").create(
        job_type="tests.noop", status="pending", attempts=2
    )
    done = old.objects.using("chain").create(job_type="tests.noop", status="completed", attempts=1)
    executor = MigrationExecutor(chain)
    executor.migrate([after])
    new = executor.loader.project_state([after]).apps.get_model("django_jobs", "JobRun")
    assert new.objects.using("chain").get(pk=retrying.pk).worker_ids == [None, None]
    assert new.objects.using("chain").get(pk=done.pk).worker_ids == []


def _index(connection: BaseDatabaseWrapper, name: str) -> tuple[bool, str] | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else (bool(row[0]), str(row[1]))


@pytest.mark.django_db(transaction=True)
def test_0010_builds_the_index_again_over_an_invalid_one_a_failed_build_left(
    chain: BaseDatabaseWrapper,
) -> None:
    """A failed CREATE INDEX CONCURRENTLY leaves an invalid index behind; running
    migrate again must replace it, not fail on the name."""
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("django_jobs", "0009_schedules"), ("django_jobs", "0010_finished_index")
    executor = MigrationExecutor(chain)
    executor.migrate([before])
    assert _index(chain, "django_jobs_run_finished") is None
    with chain.cursor() as cursor:
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
    left = _index(chain, "django_jobs_run_finished")
    assert left is not None
    assert not left[0]
    executor = MigrationExecutor(chain)
    executor.migrate([after])
    built = _index(chain, "django_jobs_run_finished")
    assert built is not None
    assert built[0]
    assert "(finished_at) WHERE (finished_at IS NOT NULL)" in built[1]


@pytest.mark.django_db(transaction=True)
def test_0011_keeps_keyed_runs_and_scopes_keys_by_tenant(chain: BaseDatabaseWrapper) -> None:
    from django.db import IntegrityError, transaction
    from django.db.migrations.executor import MigrationExecutor

    before = ("django_jobs", "0010_finished_index")
    after = ("django_jobs", "0011_idempotency_per_tenant")
    executor = MigrationExecutor(chain)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps.get_model("django_jobs", "JobRun")
    runs = old.objects.using("chain")
    kept = [
        runs.create(job_type="tests.noop", idempotency_key="k1", tenant_id="acme"),
        runs.create(job_type="tests.noop", idempotency_key="k2"),
    ]
    executor = MigrationExecutor(chain)
    executor.migrate([after])
    new = executor.loader.project_state([after]).apps.get_model("django_jobs", "JobRun")
    runs = new.objects.using("chain")
    assert set(runs.values_list("pk", flat=True)) == {run.pk for run in kept}
    # Another tenant may now use acme's key; the same tenant (or none) may not.
    runs.create(job_type="tests.noop", idempotency_key="k1", tenant_id="globex")
    runs.create(job_type="tests.noop", idempotency_key="k1")
    for tenant in ("acme", "globex", None):
        with pytest.raises(IntegrityError), transaction.atomic(using="chain"):
            runs.create(job_type="tests.noop", idempotency_key="k1", tenant_id=tenant)


def test_every_model_names_itself_for_translation() -> None:
    # Set once, so that adding or translating them later makes no migration.
    from django.apps import apps

    for model in apps.get_app_config("django_jobs").get_models():
        attrs = model._meta.original_attrs
        assert {"verbose_name", "verbose_name_plural"} <= set(attrs), model.__name__


@pytest.mark.django_db(transaction=True)
def test_0007_builds_the_ready_index_concurrently_over_a_failed_build_and_goes_back(
    chain: BaseDatabaseWrapper,
) -> None:
    """The claim's index over ready runs replaces the one over every pending run;
    an invalid index a failed concurrent build left is built anew; backwards, the
    old index comes back."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(chain)
    executor.migrate(executor.loader.graph.leaf_nodes("django_jobs"))
    with override_settings(MIGRATION_MODULES={}):
        before, after = ("django_jobs", "0006_held_runs"), ("django_jobs", "0007_ready_index")
        MigrationExecutor(chain).migrate([before])
        assert _index(chain, "django_jobs_run_ready") is None
        assert _index(chain, "django_jobs_run_claim") is not None
        with chain.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_jobs_jobrun (job_type, pool, status, priority, attempts,"
                " max_attempts, input, tags, trigger_source, trigger_ref, close_policy,"
                " cancel_reason, cancel_cascade) SELECT 'tests.noop', 'default', 'pending', 0,"
                " 0, 1, '{}', '[]', 'api', '', 'terminate', '', true FROM generate_series(1, 2)"
            )
            with pytest.raises(Exception, match="could not create unique index"):
                cursor.execute(
                    "CREATE UNIQUE INDEX CONCURRENTLY django_jobs_run_ready"
                    " ON django_jobs_jobrun (job_type)"
                )
        left = _index(chain, "django_jobs_run_ready")
        assert left is not None
        assert not left[0]
        MigrationExecutor(chain).migrate([after])
        ready, keyed = (
            _index(chain, "django_jobs_run_ready"),
            _index(chain, "django_jobs_run_keyed"),
        )
        assert ready is not None
        assert ready[0]
        assert "(pool, priority DESC, run_at) WHERE" in ready[1]
        assert "hold" in ready[1]
        assert keyed is not None
        assert keyed[0]
        assert _index(chain, "django_jobs_run_claim") is None
        MigrationExecutor(chain).migrate([before])
        assert _index(chain, "django_jobs_run_ready") is None
        assert _index(chain, "django_jobs_run_keyed") is None
        assert _index(chain, "django_jobs_run_claim") is not None
