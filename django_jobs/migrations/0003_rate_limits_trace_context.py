"""Rate limits (the JobRateLimit table, JobRun.rate_key) and the trace context of a run's starter.

On MySQL and MariaDB the new table gets the binary collation 0002 gave the
others, so that two limits whose names differ only in case or trailing spaces
stay two limits.
"""

from typing import Any

import django.db.models.functions.datetime
from django.db import migrations, models


def collate(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        server = "mariadb" if connection.mysql_is_mariadb else "mysql"
        collation = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}[server]
        schema_editor.execute(
            "ALTER TABLE django_jobs_jobratelimit "
            f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0002_mysql_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="rate_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="JobRateLimit",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "scope",
                    models.CharField(
                        choices=[("pool", "Pool"), ("job", "Job type"), ("key", "Key")],
                        max_length=8,
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                ("limit", models.PositiveIntegerField(default=0)),
                ("period", models.FloatField(default=0.0)),
                ("starts", models.JSONField(blank=True, default=list)),
                ("open_at", models.DateTimeField(blank=True, null=True)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "rate limit",
                "verbose_name_plural": "rate limits",
                "ordering": ["scope", "name"],
                "indexes": [models.Index(fields=["open_at"], name="django_jobs_ratelimit_open")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("scope", "name"), name="django_jobs_ratelimit_unique"
                    )
                ],
            },
        ),
        migrations.RunPython(collate, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
