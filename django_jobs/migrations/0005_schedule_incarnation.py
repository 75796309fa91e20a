"""A schedule's incarnation: a new value for every row made, so that a schedule deleted
and added again under its name (at revision 1 again) is never taken for the one before.

The column is nullable, with no database default, so that the workers of the
previous release, which do not name it, still insert the rows of the code
schedules they see first. The rows present when it is added all get one value
(the default, evaluated once): a worker compares a row only with the earlier
rows of its own name, so one value shared by several names is harmless.
"""

import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0004_runtime_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobschedule",
            name="incarnation",
            field=models.UUIDField(blank=True, default=uuid.uuid4, editable=False, null=True),
        ),
    ]
