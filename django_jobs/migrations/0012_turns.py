"""Turns: ``JobRun.turn``, the order in which claims take the ready runs of a pool
and priority, so that tenants take turns (``storage.turns``).

The column has a database default, so adding it rewrites no row, and workers
of the previous release, which do not name it, insert runs of turn 0 (claimed
by age among themselves, before the runs of later turns). The pending runs not
due yet are given the turn ``LATER``, as new ones are: a worker gives them a
turn when they are due.
"""

from typing import Any

from django.db import migrations, models
from django.db.models.functions import Now

LATER = 1 << 62
_BATCH = 10_000


def later(apps: Any, schema_editor: Any) -> None:
    runs = apps.get_model("django_jobs", "JobRun").objects.using(schema_editor.connection.alias)
    waiting = runs.filter(status="pending", run_at__gt=Now()).exclude(turn=LATER).order_by()
    while True:
        ids = list(waiting.values_list("id", flat=True)[:_BATCH])
        if not ids:
            return
        runs.filter(pk__in=ids).update(turn=LATER)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0011_tenant_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="turn",
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.RunPython(later, migrations.RunPython.noop, elidable=True),
    ]
