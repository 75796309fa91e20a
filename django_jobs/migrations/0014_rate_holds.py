"""Runs held for their rate limit's window: the ``hold`` value ``"rate"``, and an
index of such runs by job type and key, in claim order, to release them.

On PostgreSQL the index is partial (held runs only) and built ``CONCURRENTLY``
(as 0007 explains, a failed build is built anew by running ``migrate`` again).
On MySQL and MariaDB, which have no partial indexes, it leads with the hold:
claims and completions do not change a run's hold, so they do not write it,
and a canceled run's hold is made ready again.
"""

from typing import Any

from django.db import migrations, models

RATE_HELD = models.Index(
    models.F("job_type"),
    models.F("rate_key"),
    models.OrderBy(models.F("priority"), descending=True),
    models.F("turn"),
    models.F("run_at"),
    condition=models.Q(("hold", "rate"), ("status", "pending")),
    name="django_jobs_run_rate_held",
)

MYSQL_FORWARDS = [
    "CREATE INDEX django_jobs_run_rate_held "
    "ON django_jobs_jobrun (hold, job_type, rate_key, priority DESC, turn, run_at)",
]
MYSQL_BACKWARDS = ["DROP INDEX django_jobs_run_rate_held ON django_jobs_jobrun"]


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_FORWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                [RATE_HELD.name],
            )
            found = cursor.fetchone()
        if found is not None and found[0]:
            return
        if found is not None:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY {RATE_HELD.name}")
        schema_editor.add_index(model, RATE_HELD, concurrently=True)
    else:
        schema_editor.add_index(model, RATE_HELD)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("django_jobs", "JobRun")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        for statement in MYSQL_BACKWARDS:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {RATE_HELD.name}")
    else:
        schema_editor.remove_index(model, RATE_HELD)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_jobs", "0013_turn_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobrun",
            name="hold",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "Ready"),
                    ("key", "Its concurrency key is taken"),
                    ("tenant", "Its tenant runs as many runs as its cap allows"),
                    ("rate", "Its rate limit's window is full"),
                ],
                db_default="",
                default="",
                max_length=8,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="jobrun", index=RATE_HELD)],
            database_operations=[
                migrations.RunPython(forwards, backwards, atomic=False, elidable=False)
            ],
        ),
    ]
