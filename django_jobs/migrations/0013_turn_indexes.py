"""The claim's index in turn order, and an index of tenants' last turns.

``django_jobs_run_claimable`` replaces ``django_jobs_run_ready``: the same
ready runs, ordered by pool, priority, turn and age. ``django_jobs_run_turns``
finds the last turn of a tenant's ready runs in a pool and priority, read when its runs are
started (``storage.turns``).

On PostgreSQL both are built ``CONCURRENTLY``, the new claim index before the
old one is dropped, so a worker claims through one or the other all along (as
0007 explains, a failed build is built anew by running ``migrate`` again). On
MySQL and MariaDB, which have no partial indexes, the claim index is built with
the status and hold first, as 0007 built the old one, and the turns index over
a virtual generated column holding a ready run's turn (NULL otherwise): it
changes only when a run is claimed, not at every write of the row.
"""

from typing import Any

from django.db import migrations, models

LATER = 1 << 62

CLAIMABLE = models.Index(
    models.F("pool"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("turn"),
    models.F("run_at"),
    condition=models.Q(("hold", ""), ("status", "pending")),
    name="django_jobs_run_claimable",
)
TURNS = models.Index(
    models.F("pool"),
    models.F("priority"),
    models.F("tenant_id"),
    models.F("turn"),
    condition=models.Q(("hold", ""), ("status", "pending"), ("turn__lt", LATER)),
    name="django_jobs_run_turns",
)
READY = models.Index(
    models.F("pool"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("run_at"),
    condition=models.Q(("hold", ""), ("status", "pending")),
    name="django_jobs_run_ready",
)

MYSQL_FORWARDS = [
    "CREATE INDEX django_jobs_run_claimable "
    "ON django_jobs_jobrun (status, hold, pool, priority DESC, turn, run_at)",
    "DROP INDEX django_jobs_run_ready ON django_jobs_jobrun",
    "ALTER TABLE django_jobs_jobrun ADD COLUMN ready_turn bigint AS (CASE WHEN "
    f"status = 'pending' AND hold = '' AND turn < {LATER} THEN turn END) VIRTUAL",
    "CREATE INDEX django_jobs_run_turns "
    "ON django_jobs_jobrun (pool, priority, tenant_id, ready_turn)",
]
MYSQL_BACKWARDS = [
    "DROP INDEX django_jobs_run_turns ON django_jobs_jobrun",
    "ALTER TABLE django_jobs_jobrun DROP COLUMN ready_turn",
    "CREATE INDEX django_jobs_run_ready "
    "ON django_jobs_jobrun (status, hold, pool, priority DESC, run_at)",
    "DROP INDEX django_jobs_run_claimable ON django_jobs_jobrun",
]


def _build(schema_editor: Any, model: Any, index: models.Index) -> None:
    """Build ``index`` CONCURRENTLY on PostgreSQL, unless an earlier try built it."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [index.name]
        )
        found = cursor.fetchone()
    if found is not None and found[0]:
        return
    if found is not None:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY {schema_editor.quote_name(index.name)}")
    schema_editor.add_index(model, index, concurrently=True)


def _drop(schema_editor: Any, name: str) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_FORWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        _build(schema_editor, model, CLAIMABLE)
        _drop(schema_editor, READY.name)
        _build(schema_editor, model, TURNS)
    else:
        schema_editor.add_index(model, CLAIMABLE)
        schema_editor.remove_index(model, READY)
        schema_editor.add_index(model, TURNS)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_BACKWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        _build(schema_editor, model, READY)
        _drop(schema_editor, TURNS.name)
        _drop(schema_editor, CLAIMABLE.name)
    else:
        schema_editor.add_index(model, READY)
        schema_editor.remove_index(model, TURNS)
        schema_editor.remove_index(model, CLAIMABLE)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_jobs", "0012_turns"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="jobrun", index=CLAIMABLE),
                migrations.RemoveIndex(model_name="jobrun", name="django_jobs_run_ready"),
                migrations.AddIndex(model_name="jobrun", index=TURNS),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, atomic=False, elidable=False)
            ],
        ),
    ]
