"""The claim's index over ready runs only, and an index of pending runs by key.

``django_jobs_run_ready`` replaces ``django_jobs_run_claim``: the same columns,
over pending runs that are not held. ``django_jobs_run_keyed`` finds the pending
runs of a key (to hold them, and to release the first held one).

On PostgreSQL both are built ``CONCURRENTLY``, so that migrating does not block
the workers' writes, and the ready index before the old one is dropped: a
worker claims through one or the other all along. A concurrent build cannot run
in a transaction, so this migration changes nothing else; a build that failed
leaves an invalid index, which running ``migrate`` again drops and builds anew.
On MySQL and MariaDB, which have no partial indexes, the equivalents are built
with the status and hold first, as 0002 built the old ones; SQLite builds the
model's indexes as they are.
"""

from typing import Any

from django.db import migrations, models

READY = models.Index(
    models.F("pool"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("run_at"),
    condition=models.Q(("hold", ""), ("status", "pending")),
    name="django_jobs_run_ready",
)
KEYED = models.Index(
    models.F("concurrency_key"),
    models.F("hold"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("run_at"),
    condition=models.Q(("concurrency_key__isnull", False), ("status", "pending")),
    name="django_jobs_run_keyed",
)
CLAIM = models.Index(
    models.F("pool"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("run_at"),
    condition=models.Q(("status", "pending")),
    name="django_jobs_run_claim",
)

MYSQL_FORWARDS = [
    "CREATE INDEX django_jobs_run_ready "
    "ON django_jobs_jobrun (status, hold, pool, priority DESC, run_at)",
    "DROP INDEX django_jobs_run_due ON django_jobs_jobrun",
    "CREATE INDEX django_jobs_run_keyed "
    "ON django_jobs_jobrun (concurrency_key, status, hold, priority DESC, run_at)",
    "DROP INDEX django_jobs_run_key ON django_jobs_jobrun",
]
MYSQL_BACKWARDS = [
    "CREATE INDEX django_jobs_run_key ON django_jobs_jobrun (concurrency_key, status)",
    "DROP INDEX django_jobs_run_keyed ON django_jobs_jobrun",
    "CREATE INDEX django_jobs_run_due ON django_jobs_jobrun (status, pool, priority DESC, run_at)",
    "DROP INDEX django_jobs_run_ready ON django_jobs_jobrun",
]


def _build(schema_editor: Any, model: Any, index: models.Index) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        schema_editor.add_index(model, index)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [index.name]
        )
        found = cursor.fetchone()
    if found is not None and found[0]:
        return  # built by an earlier try
    if found is not None:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY {schema_editor.quote_name(index.name)}")
    schema_editor.add_index(model, index, concurrently=True)


def _drop(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(model, index)
        return
    name = schema_editor.quote_name(index.name)
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    if schema_editor.connection.vendor == "mysql":
        for statement in MYSQL_FORWARDS:
            schema_editor.execute(statement)
        # What 0001 built of the old claim index where Django could (MySQL 8's
        # expression indexes); a no-op on MariaDB, where it built nothing.
        schema_editor.remove_index(model, CLAIM)
        return
    _build(schema_editor, model, READY)
    _drop(schema_editor, model, CLAIM)
    _build(schema_editor, model, KEYED)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    if schema_editor.connection.vendor == "mysql":
        schema_editor.add_index(model, CLAIM)
        for statement in MYSQL_BACKWARDS:
            schema_editor.execute(statement)
        return
    _build(schema_editor, model, CLAIM)
    _drop(schema_editor, model, KEYED)
    _drop(schema_editor, model, READY)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_jobs", "0006_held_runs"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="jobrun", index=READY),
                migrations.RemoveIndex(model_name="jobrun", name="django_jobs_run_claim"),
                migrations.AddIndex(model_name="jobrun", index=KEYED),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, atomic=False, elidable=False)
            ],
        ),
    ]
