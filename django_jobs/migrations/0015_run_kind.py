"""A run's kind (``JobRun.is_async``), and the claim's index split by it.

``is_async`` says whether the run's handler is an ``async def`` as the process
that started it knew it; existing runs are not (a worker still sends such a run
to its event loop when it claims it). ``django_jobs_run_claim_kind`` replaces
``django_jobs_run_claimable``: the same ready runs, with the kind after the
pool, so that a worker's event loop and its threads each claim from their own
part of the index.

Adding a column with a constant default changes no row on PostgreSQL 11+ and on
MariaDB 10.3+ (an instant ADD COLUMN). On PostgreSQL the new index is built
``CONCURRENTLY`` before the old one is dropped, so a worker claims through one
or the other all along (as 0007 explains, a failed build is built anew by
running ``migrate`` again). On MySQL and MariaDB, which have no partial indexes,
the claim index leads with the status and hold, as 0013 built the old one.
"""

from typing import Any

from django.db import migrations, models

CLAIM_KIND = models.Index(
    models.F("pool"),
    models.F("is_async"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("turn"),
    models.F("run_at"),
    condition=models.Q(("hold", ""), ("status", "pending")),
    name="django_jobs_run_claim_kind",
)
CLAIMABLE = models.Index(
    models.F("pool"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("turn"),
    models.F("run_at"),
    condition=models.Q(("hold", ""), ("status", "pending")),
    name="django_jobs_run_claimable",
)

MYSQL_FORWARDS = [
    "CREATE INDEX django_jobs_run_claim_kind "
    "ON django_jobs_jobrun (status, hold, pool, is_async, priority DESC, turn, run_at)",
    "DROP INDEX django_jobs_run_claimable ON django_jobs_jobrun",
]
MYSQL_BACKWARDS = [
    "CREATE INDEX django_jobs_run_claimable "
    "ON django_jobs_jobrun (status, hold, pool, priority DESC, turn, run_at)",
    "DROP INDEX django_jobs_run_claim_kind ON django_jobs_jobrun",
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
        _build(schema_editor, model, CLAIM_KIND)
        _drop(schema_editor, CLAIMABLE.name)
    else:
        schema_editor.add_index(model, CLAIM_KIND)
        schema_editor.remove_index(model, CLAIMABLE)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_BACKWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        _build(schema_editor, model, CLAIMABLE)
        _drop(schema_editor, CLAIM_KIND.name)
    else:
        schema_editor.add_index(model, CLAIMABLE)
        schema_editor.remove_index(model, CLAIM_KIND)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_jobs", "0014_rate_holds"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="is_async",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="jobrun", index=CLAIM_KIND),
                migrations.RemoveIndex(model_name="jobrun", name="django_jobs_run_claimable"),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, atomic=False, elidable=False)
            ],
        ),
    ]
