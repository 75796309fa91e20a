"""Events sent to runs (``JobEvent``), the event a waiting run waits for
(``JobRun.awaiting_event``), and callers blocked on a run's end (``JobRun.awaited``).

On PostgreSQL a row trigger sends ``NOTIFY django_jobs_finished, '<run id>'``
when a run that a caller waits for (``awaited``) ends, whichever statement ends
it (a completion, a failure, a cancel, a rescue): ``JobRun.wait()`` listens for
it. The trigger's condition is evaluated for each row a status change writes;
runs nobody waits for send nothing. Both new columns have a constant default:
an instant ADD COLUMN on PostgreSQL 11+ and MariaDB 10.3+. On MySQL and MariaDB
the new table gets the binary collation 0002 gave the others, so that a wait
for "approve" never takes an event named "Approve" (the run's
``awaiting_event`` compares so too).
"""

from typing import Any

import django.core.serializers.json
import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

CREATE_TRIGGER = """
CREATE OR REPLACE FUNCTION django_jobs_notify_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('django_jobs_finished', NEW.id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER django_jobs_notify_finished
    AFTER UPDATE OF status ON django_jobs_jobrun
    FOR EACH ROW
    WHEN (NEW.awaited AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'timed_out', 'canceled'))
    EXECUTE FUNCTION django_jobs_notify_finished();
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS django_jobs_notify_finished ON django_jobs_jobrun;
DROP FUNCTION IF EXISTS django_jobs_notify_finished();
"""


def create_trigger(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        schema_editor.execute(CREATE_TRIGGER)
    elif connection.vendor == "mysql":
        server = "mariadb" if connection.mysql_is_mariadb else "mysql"
        collation = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}[server]
        schema_editor.execute(
            f"ALTER TABLE django_jobs_jobevent CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
        )


def drop_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_TRIGGER)


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0015_run_kind")]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="awaiting_event",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="awaited",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.CreateModel(
            name="JobEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=200)),
                (
                    "payload",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                    ),
                ),
                (
                    "sent_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("consumed_at", models.DateTimeField(blank=True, null=True)),
                ("consumed_by", models.CharField(blank=True, default="", max_length=255)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="django_jobs.jobrun",
                    ),
                ),
            ],
            options={
                "verbose_name": "job event",
                "verbose_name_plural": "job events",
                "ordering": ["run", "id"],
                "indexes": [
                    models.Index(
                        fields=["run", "name", "consumed_at", "id"], name="django_jobs_event_run"
                    )
                ],
            },
        ),
        migrations.RunPython(create_trigger, drop_trigger, atomic=False, elidable=False),
    ]
