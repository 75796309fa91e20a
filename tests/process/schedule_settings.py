"""The test settings plus one schedule: for the worker subprocesses of test_schedules_process.

The pytest process itself runs on tests.settings (no schedules), so no other
test's worker starts scheduled runs.
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import DJANGO_JOBS as BASE

DJANGO_JOBS = {
    **BASE,
    "SCHEDULES": {
        "process.every_minute": {
            "job_type": "tests.record",
            "cron": "* * * * *",
            "timezone": "UTC",
            "missed": "catch_up",
            "input": {"scheduled": True},
        }
    },
}
