"""Concurrency limits: ``JobRun.concurrency_limit`` and ``JobRun.concurrency_slot``.

A run's limit says how many runs of its concurrency key may run at once (1, as
before, by default); a running run of a key holds one of the key's slots. Both
columns are added without rewriting a row (a database default, or NULL), and
the workers of the previous release, which name neither, insert runs of limit 1.
0009 moves the key's uniqueness from the key to its slots.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0007_ready_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="concurrency_limit",
            field=models.PositiveSmallIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="concurrency_slot",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
    ]
