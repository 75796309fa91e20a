# Idempotency keys scoped by tenant as well as job type.
#
# The old constraint was stricter than the two new ones together, so every
# existing row satisfies them: no data changes. The operations run in one
# transaction on PostgreSQL, so there is no moment without uniqueness; building
# the two partial indexes blocks writes to the runs table while it lasts (only
# rows with a key are indexed).
#
# It also makes deleting a Worker row that still holds running runs an error
# (on_delete, in Python only: no SQL), and names the models for translation
# (verbose names, no SQL).

from django.db import migrations, models

import django_jobs.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0010_finished_index"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("idempotency_key__isnull", False), ("tenant_id__isnull", False)
                ),
                fields=("job_type", "tenant_id", "idempotency_key"),
                name="django_jobs_run_tenant_idempotency",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="jobrun",
            name="django_jobs_run_idempotency",
        ),
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key__isnull", False), ("tenant_id__isnull", True)),
                fields=("job_type", "idempotency_key"),
                name="django_jobs_run_idempotency",
            ),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="claimed_by",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django_jobs.models.protect_running_runs,
                related_name="runs",
                to="django_jobs.worker",
            ),
        ),
        migrations.AlterModelOptions(
            name="jobpool",
            options={
                "ordering": ["name"],
                "permissions": [("pause_jobpool", "Can pause and resume pools")],
                "verbose_name": "job pool",
                "verbose_name_plural": "job pools",
            },
        ),
        migrations.AlterModelOptions(
            name="jobrun",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_jobrun", "Can retry runs"),
                    ("cancel_jobrun", "Can cancel runs"),
                    ("run_now_jobrun", "Can start pending runs now"),
                ],
                "verbose_name": "job run",
                "verbose_name_plural": "job runs",
            },
        ),
        migrations.AlterModelOptions(
            name="jobschedule",
            options={
                "ordering": ["name"],
                "verbose_name": "job schedule",
                "verbose_name_plural": "job schedules",
            },
        ),
        migrations.AlterModelOptions(
            name="jobstep",
            options={
                "ordering": ["run", "seq"],
                "verbose_name": "job step",
                "verbose_name_plural": "job steps",
            },
        ),
        migrations.AlterModelOptions(
            name="worker",
            options={
                "ordering": ["-started_at"],
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
            },
        ),
    ]
