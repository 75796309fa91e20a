# The partial index on finished runs, in a migration of its own: CREATE INDEX
# CONCURRENTLY cannot run inside a transaction, and a non-atomic migration that
# also changed tables could stop half-applied.

from typing import Any

from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex without locking writes on PostgreSQL: workers keep running during migrate.

    A concurrent build that failed (a cancelled statement, a lost connection)
    leaves an invalid index of the same name behind, on which the next ``migrate``
    would fail. It is dropped first, so running ``migrate`` again finishes the job;
    a valid index of the same name and table is kept.
    """

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        valid = self._existing(schema_editor, model._meta.db_table)
        if valid:
            return
        if valid is not None:
            schema_editor.execute(
                f"DROP INDEX CONCURRENTLY {schema_editor.quote_name(self.index.name)}"
            )
        schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)

    def _existing(self, schema_editor: Any, table: str) -> bool | None:
        """Whether an index of this name exists on ``table`` and is valid (None: none)."""
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = %s AND i.indrelid = %s::regclass"
                " AND pg_table_is_visible(c.oid)",
                [self.index.name, table],
            )
            row = cursor.fetchone()
        return None if row is None else bool(row[0])


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_jobs", "0009_schedules"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at"],
                name="django_jobs_run_finished",
            ),
        ),
    ]
