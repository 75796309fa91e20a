"""Quick drain measurement of django_jobs alone (the full harness is bench/run.py).

.venv/bin/python bench/quick.py --n 20000 --workers 1 --concurrency 4
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
DB = "bench_django_jobs_quick"
ADMIN_DSN = os.environ.get("BENCH_ADMIN_DSN", "host=127.0.0.1 user=postgres dbname=postgres")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--job", default="bench.noop")
    args = parser.parse_args()
    with psycopg.connect(ADMIN_DSN, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    env = dict(os.environ, BENCH_DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB}")
    manage = [sys.executable, os.path.join(HERE, "project", "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True)
    enqueue = (
        "import time; from django_jobs import start_many; t=time.perf_counter(); "
        f"start_many({args.job!r}, [{{}}] * {args.n}); "
        f"print(round({args.n}/(time.perf_counter()-t)))"
    )
    out = subprocess.run(
        [*manage, "shell", "-c", enqueue], env=env, check=True, capture_output=True, text=True
    )
    print(f"enqueue jobs/s: {out.stdout.strip().splitlines()[-1]}")
    with psycopg.connect(ADMIN_DSN.replace("dbname=postgres", f"dbname={DB}")) as c:
        c.execute("ANALYZE")
    verbosity = os.environ.get("BENCH_VERBOSITY", "0")
    cmd = [*manage, "runjobworker", "--burst", "--concurrency", str(args.concurrency)]
    cmd += ["-v", verbosity]
    started = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env) for _ in range(args.workers)]
    for proc in procs:
        proc.wait(timeout=600)
    wall = time.perf_counter() - started
    with psycopg.connect(ADMIN_DSN.replace("dbname=postgres", f"dbname={DB}")) as c:
        done, span = c.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
            "FROM django_jobs_jobrun WHERE status = 'completed'"
        ).fetchone()
    print(
        f"completed {done}/{args.n}; drain jobs/s (DB timestamps): {done / float(span):,.0f}; "
        f"wall {wall:.1f}s"
    )


if __name__ == "__main__":
    main()
