from typing import Any

from django.db import migrations, models


def backfill_unfinished(apps: Any, schema_editor: Any) -> None:
    """Give unfinished runs one entry per attempt they have already counted.

    Their workers were not recorded: the entries are null. Finished runs keep
    an empty list (rewriting the whole history would be a long table rewrite).
    """
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "UPDATE django_jobs_jobrun SET worker_ids = ("
        "SELECT jsonb_agg(NULL::text) FROM generate_series(1, attempts)) "
        "WHERE attempts > 0 AND status IN ('pending', 'running', 'waiting')"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0006_lean_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="worker_ids",
            field=models.JSONField(
                blank=True,
                db_default=models.Value([], output_field=models.JSONField()),
                default=list,
            ),
        ),
        migrations.RunPython(backfill_unfinished, migrations.RunPython.noop, elidable=True),
    ]
