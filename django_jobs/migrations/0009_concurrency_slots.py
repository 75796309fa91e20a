"""At most one running run per slot of a concurrency key, rather than per key.

``django_jobs_run_concurrency_slot`` replaces ``django_jobs_run_concurrency``:
unique over a running run's key and slot, a run without a slot counting as slot
0. Runs of limit 1 only ever take slot 0, so for them nothing changes; and the
workers of the previous release, which claim without a slot, are still kept to
one running run per key while both releases run side by side.

On PostgreSQL the new index is built ``CONCURRENTLY`` before the old one is
dropped, so that migrating blocks no worker and the database refuses a second
running run of a key all along (as 0007 explains, a failed build is built anew
by running ``migrate`` again). On MySQL and MariaDB, which have no partial
indexes, a virtual generated column holds the slot of a running run with a key
(NULL otherwise), under a unique index with 0002's ``running_concurrency_key``.
"""

from typing import Any

from django.db import migrations, models
from django.db.models.functions import Coalesce

SLOTS = models.UniqueConstraint(
    models.F("concurrency_key"),
    Coalesce(models.F("concurrency_slot"), models.Value(0)),
    condition=models.Q(("concurrency_key__isnull", False), ("status", "running")),
    name="django_jobs_run_concurrency_slot",
)
KEYS = models.UniqueConstraint(
    condition=models.Q(("concurrency_key__isnull", False), ("status", "running")),
    fields=("concurrency_key",),
    name="django_jobs_run_concurrency",
)

MYSQL_FORWARDS = [
    "ALTER TABLE django_jobs_jobrun ADD COLUMN running_concurrency_slot smallint unsigned "
    "AS (CASE WHEN status = 'running' AND concurrency_key IS NOT NULL "
    "THEN COALESCE(concurrency_slot, 0) END) VIRTUAL",
    "CREATE UNIQUE INDEX django_jobs_run_concurrency_slot "
    "ON django_jobs_jobrun (running_concurrency_key, running_concurrency_slot)",
    "DROP INDEX django_jobs_run_concurrency ON django_jobs_jobrun",
]
MYSQL_BACKWARDS = [
    "CREATE UNIQUE INDEX django_jobs_run_concurrency "
    "ON django_jobs_jobrun (running_concurrency_key)",
    "DROP INDEX django_jobs_run_concurrency_slot ON django_jobs_jobrun",
    "ALTER TABLE django_jobs_jobrun DROP COLUMN running_concurrency_slot",
]


def _valid(schema_editor: Any, name: str) -> bool | None:
    """Whether PostgreSQL's index ``name`` is valid; None when there is none."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        found = cursor.fetchone()
    return None if found is None else bool(found[0])


def _build(schema_editor: Any, model: Any, constraint: models.UniqueConstraint) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_constraint(model, constraint)
        return
    valid = _valid(schema_editor, constraint.name)
    if valid:
        return  # built by an earlier try
    name = schema_editor.quote_name(constraint.name)
    if valid is not None:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY {name}")
    # A partial unique constraint is a unique index in PostgreSQL: built as one.
    if constraint.fields:
        index = models.Index(
            fields=list(constraint.fields), name=constraint.name, condition=constraint.condition
        )
    else:
        index = models.Index(
            *constraint.expressions, name=constraint.name, condition=constraint.condition
        )
    sql = str(index.create_sql(model, schema_editor, concurrently=True))
    schema_editor.execute(sql.replace("CREATE INDEX", "CREATE UNIQUE INDEX", 1))


def _drop(schema_editor: Any, model: Any, constraint: models.UniqueConstraint) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_constraint(model, constraint)
        return
    name = schema_editor.quote_name(constraint.name)
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    if schema_editor.connection.vendor == "mysql":
        for statement in MYSQL_FORWARDS:
            schema_editor.execute(statement)
        return
    _build(schema_editor, model, SLOTS)
    _drop(schema_editor, model, KEYS)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    if schema_editor.connection.vendor == "mysql":
        for statement in MYSQL_BACKWARDS:
            schema_editor.execute(statement)
        return
    _build(schema_editor, model, KEYS)
    _drop(schema_editor, model, SLOTS)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_jobs", "0008_concurrency_limits"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="jobrun", name="django_jobs_run_concurrency"
                ),
                migrations.AddConstraint(model_name="jobrun", constraint=SLOTS),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, atomic=False, elidable=False)
            ],
        ),
    ]
