"""The job tables, their indexes and constraints, and the NOTIFY trigger.

The migrations 0001 to 0011 of the releases before the first were squashed into
this one (tests/migration_chain keeps them, and a test checks that both reach
the same schema).
"""

import uuid
from typing import Any

import django.core.serializers.json
import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

import django_jobs.models

# On PostgreSQL, NOTIFY listening workers when an INSERT adds due runs (notify.py).
CREATE_TRIGGER = """
CREATE OR REPLACE FUNCTION django_jobs_notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- One notification per pool and statement, delivered at commit.
    PERFORM pg_notify('django_jobs', due.pool)
    FROM (SELECT DISTINCT pool FROM new_runs
          WHERE status = 'pending' AND run_at <= statement_timestamp()) AS due;
    RETURN NULL;
END
$$;
CREATE TRIGGER django_jobs_notify_inserted
    AFTER INSERT ON django_jobs_jobrun
    REFERENCING NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION django_jobs_notify_inserted();
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS django_jobs_notify_inserted ON django_jobs_jobrun;
DROP FUNCTION IF EXISTS django_jobs_notify_inserted();
"""


def create_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE_TRIGGER)


def drop_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_TRIGGER)


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="JobPool",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("pause_reason", models.TextField(blank=True, default="")),
            ],
            options={
                "verbose_name": "job pool",
                "verbose_name_plural": "job pools",
                "ordering": ["name"],
                "permissions": [("pause_jobpool", "Can pause and resume pools")],
            },
        ),
        migrations.CreateModel(
            name="JobSchedule",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("job_type", models.CharField(max_length=200)),
                ("cron", models.TextField()),
                ("timezone", models.CharField(max_length=100)),
                ("missed", models.CharField(max_length=16)),
                ("last_tick", models.DateTimeField(blank=True, null=True)),
                ("next_tick", models.DateTimeField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "job schedule",
                "verbose_name_plural": "job schedules",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Worker",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("hostname", models.CharField(max_length=255)),
                ("pid", models.PositiveIntegerField()),
                ("pools", models.JSONField(default=list)),
                ("concurrency", models.PositiveIntegerField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("running", "Running"),
                            ("stopping", "Stopping"),
                            ("stopped", "Stopped"),
                            ("lost", "Lost"),
                        ],
                        default="running",
                        max_length=16,
                    ),
                ),
                (
                    "started_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "heartbeat_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
                "ordering": ["-started_at"],
                "indexes": [
                    models.Index(fields=["status", "heartbeat_at"], name="django_jobs_worker_live")
                ],
            },
        ),
        migrations.CreateModel(
            name="JobRun",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_type", models.CharField(max_length=200)),
                ("pool", models.CharField(default="default", max_length=100)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("waiting", "Waiting"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("timed_out", "Timed out"),
                            ("canceled", "Canceled"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("priority", models.SmallIntegerField(default=0)),
                (
                    "run_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("max_attempts", models.PositiveIntegerField(default=1)),
                (
                    "worker_ids",
                    models.JSONField(
                        blank=True,
                        db_default=models.Value([], output_field=models.JSONField()),
                        default=list,
                    ),
                ),
                (
                    "input",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                    ),
                ),
                (
                    "output",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                    ),
                ),
                (
                    "error",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                    ),
                ),
                ("concurrency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("tags", models.JSONField(blank=True, default=list)),
                ("tenant_id", models.CharField(blank=True, max_length=100, null=True)),
                ("trigger_source", models.CharField(default="api", max_length=32)),
                ("trigger_ref", models.CharField(blank=True, default="", max_length=255)),
                (
                    "close_policy",
                    models.CharField(
                        choices=[
                            ("terminate", "Terminate"),
                            ("abandon", "Abandon"),
                            ("request_cancel", "Request cancel"),
                        ],
                        default="terminate",
                        max_length=16,
                    ),
                ),
                (
                    "progress",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                    ),
                ),
                ("awaiting", models.JSONField(blank=True, null=True)),
                ("lease_token", models.UUIDField(blank=True, null=True)),
                ("cancel_requested_at", models.DateTimeField(blank=True, null=True)),
                ("cancel_reason", models.TextField(blank=True, default="")),
                ("cancel_cascade", models.BooleanField(default=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "parent",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="children",
                        to="django_jobs.jobrun",
                    ),
                ),
                (
                    "root",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="descendants",
                        to="django_jobs.jobrun",
                    ),
                ),
                (
                    "claimed_by",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django_jobs.models.protect_running_runs,
                        related_name="runs",
                        to="django_jobs.worker",
                    ),
                ),
            ],
            options={
                "verbose_name": "job run",
                "verbose_name_plural": "job runs",
                "ordering": ["-id"],
                "permissions": [
                    ("retry_jobrun", "Can retry runs"),
                    ("cancel_jobrun", "Can cancel runs"),
                    ("run_now_jobrun", "Can start pending runs now"),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobStep",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("step_id", models.CharField(max_length=255)),
                ("seq", models.PositiveIntegerField()),
                (
                    "status",
                    models.CharField(
                        choices=[("completed", "Completed"), ("failed", "Failed")], max_length=16
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=1)),
                (
                    "output",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                    ),
                ),
                (
                    "error",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                    ),
                ),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="django_jobs.jobrun",
                    ),
                ),
            ],
            options={
                "verbose_name": "job step",
                "verbose_name_plural": "job steps",
                "ordering": ["run", "seq"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("run", "step_id"), name="django_jobs_step_unique"
                    )
                ],
            },
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                models.F("pool"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status", "pending")),
                name="django_jobs_run_claim",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("status", "running")),
                fields=["claimed_by"],
                name="django_jobs_run_running",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["run_at"],
                name="django_jobs_run_waiting",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("status__in", ["failed", "timed_out", "canceled", "waiting"])),
                fields=["status", "job_type"],
                name="django_jobs_run_attention",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at"],
                name="django_jobs_run_finished",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent"],
                name="django_jobs_run_parent",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("root__isnull", False)),
                fields=["root"],
                name="django_jobs_run_root",
            ),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("tenant_id__isnull", False)),
                fields=["tenant_id"],
                name="django_jobs_run_tenant",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key__isnull", False), ("tenant_id__isnull", True)),
                fields=("job_type", "idempotency_key"),
                name="django_jobs_run_idempotency",
            ),
        ),
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
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.UniqueConstraint(
                condition=models.Q(("concurrency_key__isnull", False), ("status", "running")),
                fields=("concurrency_key",),
                name="django_jobs_run_concurrency",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        [
                            "pending",
                            "running",
                            "waiting",
                            "completed",
                            "failed",
                            "timed_out",
                            "canceled",
                        ],
                    )
                ),
                name="django_jobs_run_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("lease_token__isnull", True), ("status", "running"), _connector="OR"
                ),
                name="django_jobs_run_lease_running",
            ),
        ),
        migrations.RunPython(create_trigger, drop_trigger),
    ]
