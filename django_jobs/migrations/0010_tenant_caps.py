"""Tenant caps: ``JobRun.tenant_slot``, and runs held for their tenant's cap.

``DJANGO_JOBS["TENANT_CONCURRENCY"]`` caps how many runs of one tenant run at
once in a pool; a running run of a capped tenant holds one of its slots, and a
run beyond the cap waits held (``hold = 'tenant'``). The column is nullable, so
adding it rewrites no row; 0011 builds its indexes.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0009_concurrency_slots"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="tenant_slot",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="hold",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "Ready"),
                    ("key", "Its concurrency key is taken"),
                    ("tenant", "Its tenant runs as many runs as its cap allows"),
                ],
                db_default="",
                default="",
                max_length=8,
            ),
        ),
    ]
