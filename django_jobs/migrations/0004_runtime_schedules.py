"""Run-time schedules: a schedule's source, input, pause and revision, and the pause permission.

Every new column has a database default or is nullable, so that the workers of
the previous release, which name none of them, still insert the rows of the
schedules they see first (as ``code`` schedules, never paused).

On MySQL and MariaDB the new text column takes the table's default collation,
the binary one 0002 gave it (``ALTER TABLE ... CONVERT`` also sets the
default); ``input`` is a JSON column (MariaDB's is ``longtext`` under
``utf8mb4_bin``), which nothing compares.
"""

import django.core.serializers.json
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0003_rate_limits_trace_context"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="jobschedule",
            options={
                "ordering": ["name"],
                "permissions": [("pause_jobschedule", "Can pause and resume schedules")],
                "verbose_name": "job schedule",
                "verbose_name_plural": "job schedules",
            },
        ),
        migrations.AddField(
            model_name="jobschedule",
            name="source",
            field=models.CharField(
                choices=[("code", "code"), ("runtime", "run time")],
                db_default="code",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="jobschedule",
            name="input",
            field=models.JSONField(
                blank=True, encoder=django.core.serializers.json.DjangoJSONEncoder, null=True
            ),
        ),
        migrations.AddField(
            model_name="jobschedule",
            name="paused_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="jobschedule",
            name="revision",
            field=models.IntegerField(db_default=0),
        ),
    ]
