"""django-tasks-db driver: drain1 (enqueue, one ``manage.py db_worker`` process with its
defaults, idle latency) and drain2 (2 processes). It has no bulk enqueue: the timed
enqueue is N x ``noop.enqueue()`` inside one ``transaction.atomic()``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import common

DB = "bench_run_djtasks"
LAT_FILE = f"/tmp/{DB}_lat.txt"
HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = "django_tasks_database_dbtaskresult"
os.environ["BENCH_DB"] = DB
os.environ["BENCH_LAT_FILE"] = LAT_FILE
os.environ["DJANGO_SETTINGS_MODULE"] = "django_tasks_db_settings"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    common.recreate_db(DB)
    common.fresh_file(LAT_FILE)
    import django

    django.setup()
    import django_tasks_db_tasks as tasks
    from django.core.management import call_command
    from django.db import transaction

    call_command("migrate", verbosity=0)
    workers_n = 2 if args.case == "drain2" else 1
    record: dict[str, Any] = {
        "workers": workers_n,
        "config": "db_worker defaults, CONN_MAX_AGE 600",
    }
    n = args.n
    t = time.perf_counter()
    with transaction.atomic():
        for _ in range(n):
            tasks.noop.enqueue()
    seconds = time.perf_counter() - t
    record.update(enqueue_s=round(seconds, 3), enqueue_per_s=round(n / seconds, 1))
    common.analyze(DB, TABLE)
    noop = f"{TABLE} WHERE task_path = 'django_tasks_db_tasks.noop'"
    done_sql = f"SELECT count(*) FROM {noop} AND status IN ('SUCCESSFUL', 'FAILED')"
    cmd = [sys.executable, "-m", "django", "db_worker", "--no-startup-delay"]
    env = {"PYTHONPATH": HERE}
    with common.Workers(f"django_tasks_db_{args.case}", [cmd] * workers_n, HERE, env) as workers:
        with common.LoadMonitor() as load:
            record.update(common.wait_drained(DB, done_sql, n, workers))
        record.update(load.result)
        span = common.span_seconds(DB, TABLE, "task_path = 'django_tasks_db_tasks.noop'")
        record["drain_db_per_s"] = round(n / span, 1) if span else None
        failed = common.scalar(DB, f"SELECT count(*) FROM {noop} AND status <> 'SUCCESSFUL'")
        if failed:
            raise RuntimeError(f"{failed} tasks did not succeed")
        if args.case == "drain1":

            def probe(tag: str) -> None:
                tasks.latency.enqueue(tag)

            record["warmup_probe_s"] = common.wait_started(LAT_FILE, probe)
            record.update(common.measure_latency(probe, LAT_FILE, args.lat_samples))
    return record


if __name__ == "__main__":
    common.driver_main(measure)
