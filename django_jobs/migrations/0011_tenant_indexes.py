"""The indexes of tenant caps: pending runs by tenant, and one running run per slot.

``django_jobs_run_tenanted`` finds a tenant's pending runs in a pool (to hold
them at its cap, and to release the first held ones); the unique
``django_jobs_run_tenant_slot`` keeps one running run per slot of a tenant's
cap in a pool. On PostgreSQL both are built ``CONCURRENTLY`` (as 0007 explains,
a failed build is built anew by running ``migrate`` again). On MySQL and
MariaDB, which have no partial indexes, only the second, over a virtual
generated column holding a running run's slot: its (tenant, pool) prefix finds
a tenant's runs (its history too, read only for capped tenants), where an
index of pending runs by tenant would be one over every row, with the status
in it: written at every claim and completion of every run, for the few
statements that tenant caps make.
"""

from typing import Any

from django.db import migrations, models

TENANTED = models.Index(
    models.F("tenant_id"),
    models.F("pool"),
    models.F("hold"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("run_at"),
    condition=models.Q(("status", "pending"), ("tenant_id__isnull", False)),
    name="django_jobs_run_tenanted",
)
SLOTS = models.UniqueConstraint(
    fields=("tenant_id", "pool", "tenant_slot"),
    condition=models.Q(
        ("status", "running"), ("tenant_id__isnull", False), ("tenant_slot__isnull", False)
    ),
    name="django_jobs_run_tenant_slot",
)

MYSQL_FORWARDS = [
    "ALTER TABLE django_jobs_jobrun ADD COLUMN running_tenant_slot smallint unsigned "
    "AS (CASE WHEN status = 'running' THEN tenant_slot END) VIRTUAL",
    "CREATE UNIQUE INDEX django_jobs_run_tenant_slot "
    "ON django_jobs_jobrun (tenant_id, pool, running_tenant_slot)",
]
MYSQL_BACKWARDS = [
    "DROP INDEX django_jobs_run_tenant_slot ON django_jobs_jobrun",
    "ALTER TABLE django_jobs_jobrun DROP COLUMN running_tenant_slot",
]


def _build(schema_editor: Any, model: Any, index: models.Index, *, unique: bool) -> None:
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
    sql = str(index.create_sql(model, schema_editor, concurrently=True))
    if unique:
        sql = sql.replace("CREATE INDEX", "CREATE UNIQUE INDEX", 1)
    schema_editor.execute(sql)


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_FORWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        _build(schema_editor, model, TENANTED, unique=False)
        slots = models.Index(fields=list(SLOTS.fields), name=SLOTS.name, condition=SLOTS.condition)
        _build(schema_editor, model, slots, unique=True)
    else:
        schema_editor.add_index(model, TENANTED)
        schema_editor.add_constraint(model, SLOTS)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_BACKWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        for name in (SLOTS.name, TENANTED.name):
            schema_editor.execute(
                f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}"
            )
    else:
        schema_editor.remove_constraint(model, SLOTS)
        schema_editor.remove_index(model, TENANTED)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_jobs", "0010_tenant_caps"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="jobrun", index=TENANTED),
                migrations.AddConstraint(model_name="jobrun", constraint=SLOTS),
            ],
            database_operations=[
                migrations.RunPython(forwards, backwards, atomic=False, elidable=False)
            ],
        ),
    ]
