"""Held runs: ``JobRun.hold``, which says whether a pending run is ready or held.

A pending run whose concurrency key is taken is held (``hold = 'key'``) and
leaves the claim's index (0007), so that a backlog of such runs costs a claim
nothing (``storage.holds``). The column has a database default, so adding it
rewrites no row (PostgreSQL 11+, MariaDB 10.3+ add it in place), and the
workers of the previous release, which do not name it, insert ready runs.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0005_schedule_incarnation"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="hold",
            field=models.CharField(
                blank=True,
                choices=[("", "Ready"), ("key", "Its concurrency key is taken")],
                db_default="",
                default="",
                max_length=8,
            ),
        ),
    ]
