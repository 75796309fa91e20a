"""Time the admin's run pages on a table of 1,000,000 runs (not part of the test suite).

Usage (a scratch database is created and dropped):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/admin_1m.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import django
    from django.conf import settings

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    setup_test_environment()
    settings.ALLOWED_HOSTS = ["testserver"]
    name = "django_jobs_admin_bench"
    creation = connection.creation
    connection.settings_dict["TEST"]["NAME"] = name
    creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        call_command("migrate", verbosity=0)
        fill(args.rows)
        measure(args.repeat, CaptureQueriesContext)
    finally:
        creation.destroy_test_db(name, verbosity=0)


def fill(rows: int) -> None:
    from django.db import connection

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_jobs_jobrun
                (job_type, pool, status, priority, run_at, attempts, max_attempts, input,
                 tags, trigger_source, trigger_ref, close_policy, cancel_reason,
                 cancel_cascade, created_at, started_at, finished_at, tenant_id)
            SELECT
                'tests.echo', CASE WHEN g %% 10 = 0 THEN 'mail' ELSE 'default' END,
                CASE WHEN g %% 100 = 0 THEN 'failed' WHEN g %% 997 = 0 THEN 'pending'
                     ELSE 'completed' END,
                0, now() - (g || ' seconds')::interval, 1, 1, jsonb_build_object('n', g),
                '[]'::jsonb, 'api', '', 'terminate', '', true,
                now() - (g || ' seconds')::interval, now() - (g || ' seconds')::interval,
                now() - (g || ' seconds')::interval + interval '20 ms',
                CASE WHEN g %% 50 = 0 THEN 'tenant-' || (g %% 7) END
            FROM generate_series(1, %s) AS g
            """,
            [rows],
        )
        cursor.execute("VACUUM ANALYZE django_jobs_jobrun")
    print(f"filled {rows:,} runs in {time.monotonic() - started:.1f}s")


def measure(repeat: int, capture: type) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from django_jobs.models import JobRun

    user = User.objects.create_superuser("bench", password="x")
    client = Client()
    client.force_login(user)
    run = JobRun.objects.filter(status="failed").first()
    assert run is not None
    pages = {
        "changelist": "/admin/django_jobs/jobrun/",
        "filter status=failed": "/admin/django_jobs/jobrun/?status__exact=failed",
        "filter pool+status": "/admin/django_jobs/jobrun/?pool=mail&status__exact=failed",
        "search by id": f"/admin/django_jobs/jobrun/?q={run.pk}",
        "page 100": "/admin/django_jobs/jobrun/?p=100",
        "run page": f"/admin/django_jobs/jobrun/{run.pk}/change/",
        "pools": "/admin/django_jobs/jobrun/pools/",
    }
    print(f"{'page':<24} {'median ms':>10} {'max ms':>8} {'queries':>8}")
    for label, url in pages.items():
        timings = []
        for _ in range(repeat):
            with capture(connection) as queries:
                started = time.monotonic()
                response = client.get(url)
                timings.append((time.monotonic() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        print(
            f"{label:<24} {statistics.median(timings):>10.1f} {max(timings):>8.1f} "
            f"{len(queries.captured_queries):>8}"
        )


if __name__ == "__main__":
    main()
