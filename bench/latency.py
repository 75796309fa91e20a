"""Idle enqueue-to-claim latency of one worker (database clock: started_at - created_at).

.venv/bin/python bench/latency.py [--samples 30] [--no-listen]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
DB = "bench_django_jobs_latency"
ADMIN_DSN = os.environ.get("BENCH_ADMIN_DSN", "host=127.0.0.1 user=postgres dbname=postgres")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--no-listen", action="store_true")
    args = parser.parse_args()
    with psycopg.connect(ADMIN_DSN, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    env = dict(
        os.environ,
        BENCH_DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB}",
        BENCH_LISTEN_NOTIFY="0" if args.no_listen else "1",
    )
    manage = [sys.executable, os.path.join(HERE, "project", "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True)
    worker = subprocess.Popen([*manage, "runjobworker", "-v", "0"], env=env)
    dsn = ADMIN_DSN.replace("dbname=postgres", f"dbname={DB}")
    try:
        time.sleep(3)  # worker start-up
        lat = []
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(args.samples):
                time.sleep(random.uniform(0.2, 0.6))
                run_id = c.execute(
                    "INSERT INTO django_jobs_jobrun (job_type, pool, status, priority, attempts,"
                    " max_attempts, input, tags, trigger_source, trigger_ref, close_policy,"
                    " cancel_reason, cancel_cascade) VALUES ('bench.noop', 'default', 'pending',"
                    " 0, 0, 1, '{}', '[]', 'api', '', 'terminate', '', true) RETURNING id"
                ).fetchone()[0]
                while True:
                    row = c.execute(
                        "SELECT extract(epoch FROM started_at - created_at) FROM django_jobs_jobrun"
                        " WHERE id = %s AND started_at IS NOT NULL",
                        [run_id],
                    ).fetchone()
                    if row:
                        lat.append(float(row[0]) * 1000)
                        break
                    time.sleep(0.001)
        lat.sort()
        print(
            f"listen={'off' if args.no_listen else 'on'} samples={len(lat)} "
            f"p50={statistics.median(lat):.1f}ms p90={lat[int(0.9 * (len(lat) - 1))]:.1f}ms "
            f"max={lat[-1]:.1f}ms"
        )
    finally:
        worker.terminate()
        worker.wait(30)


if __name__ == "__main__":
    main()
