"""On MySQL and MariaDB, what 0001 could not build there; nothing elsewhere.

They have no partial indexes and MariaDB no expression indexes, so Django builds
0001's partial indexes over every row, leaves out the claim index, and leaves
out the three partial unique constraints altogether. This migration gives the
keys their uniqueness by the database again: a generated column that is NULL
unless the row must be unique, under a unique index (NULLs never collide). It
also builds the claim and wake-up indexes with the status first, and makes the
tables' text compare byte for byte, trailing spaces included (a binary NO PAD
collation): under the server's usual collation, tenant "acme" would match
tenant "ACME " and two step ids differing only in case would be one step.
"""

from typing import Any

from django.db import migrations

TABLES = (
    "django_jobs_jobpool",
    "django_jobs_jobschedule",
    "django_jobs_worker",
    "django_jobs_jobrun",
    "django_jobs_jobstep",
)

# Binary collations without padding: "acme" and "acme " are two tenants.
COLLATIONS = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}


def collate(collation: str) -> list[str]:
    return [
        # The columns' collation changes on both sides of each foreign key, one
        # table at a time: the keys are checked again once all are changed.
        "SET FOREIGN_KEY_CHECKS = 0",
        *(
            f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
            for table in TABLES
        ),
        "SET FOREIGN_KEY_CHECKS = 1",
    ]


FORWARDS = [
    """
    ALTER TABLE django_jobs_jobrun
        ADD COLUMN running_concurrency_key varchar(255)
            AS (CASE WHEN status = 'running' THEN concurrency_key END) STORED,
        ADD COLUMN untenanted_idempotency_key varchar(255)
            AS (CASE WHEN tenant_id IS NULL THEN idempotency_key END) STORED
    """,
    # At most one running run per concurrency key.
    "CREATE UNIQUE INDEX django_jobs_run_concurrency "
    "ON django_jobs_jobrun (running_concurrency_key)",
    # One run per idempotency key, job type and tenant (NULL tenant_id: no tenant).
    "CREATE UNIQUE INDEX django_jobs_run_idempotency "
    "ON django_jobs_jobrun (job_type, untenanted_idempotency_key)",
    "CREATE UNIQUE INDEX django_jobs_run_tenant_idempotency "
    "ON django_jobs_jobrun (job_type, tenant_id, idempotency_key)",
    # The claim: pending runs of a pool in claim order.
    "CREATE INDEX django_jobs_run_due ON django_jobs_jobrun (status, pool, priority DESC, run_at)",
    # Whether a concurrency key is running now (the claim passes such runs over).
    "CREATE INDEX django_jobs_run_key ON django_jobs_jobrun (concurrency_key, status)",
    # Sleeping runs by wake-up time, rather than every run by run_at.
    "DROP INDEX django_jobs_run_waiting ON django_jobs_jobrun",
    "CREATE INDEX django_jobs_run_waiting ON django_jobs_jobrun (status, run_at)",
]

BACKWARDS = [
    "DROP INDEX django_jobs_run_waiting ON django_jobs_jobrun",
    "CREATE INDEX django_jobs_run_waiting ON django_jobs_jobrun (run_at)",
    "DROP INDEX django_jobs_run_key ON django_jobs_jobrun",
    "DROP INDEX django_jobs_run_due ON django_jobs_jobrun",
    "DROP INDEX django_jobs_run_tenant_idempotency ON django_jobs_jobrun",
    "DROP INDEX django_jobs_run_idempotency ON django_jobs_jobrun",
    "DROP INDEX django_jobs_run_concurrency ON django_jobs_jobrun",
    "ALTER TABLE django_jobs_jobrun "
    "DROP COLUMN untenanted_idempotency_key, DROP COLUMN running_concurrency_key",
    # The tables keep the binary collation: the one they had is not recorded.
]


def forwards(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        server = "mariadb" if connection.mysql_is_mariadb else "mysql"
        for statement in [*collate(COLLATIONS[server]), *FORWARDS]:
            schema_editor.execute(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for statement in BACKWARDS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0001_initial")]

    # MySQL cannot roll DDL back: each statement stands on its own.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
