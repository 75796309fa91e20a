"""On PostgreSQL, NOTIFY listening workers when an INSERT adds due runs (see notify.py)."""

from typing import Any

from django.db import migrations

CREATE = """
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

DROP = """
DROP TRIGGER IF EXISTS django_jobs_notify_inserted ON django_jobs_jobrun;
DROP FUNCTION IF EXISTS django_jobs_notify_inserted();
"""


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0004_cancel_cascade")]

    operations = [migrations.RunPython(create, drop)]
