"""What one claim costs beside rate-limited runs: a held backlog, and limits in force.

.venv/bin/python bench/ratelimit_claims.py [--database mariadb] [--held 0,600,10000,100000]

For each size of held backlog (due runs of ``bench.limited`` under "1/h", its
window full, older than the rest so that they head the claim index), 20 claims
of 16 are timed, the worker's way (``claim_batch`` with the limits in force):
with unlimited runs (``bench.noop``) due behind the backlog, which fill every
claim, and with none, so that every claim comes back empty. The table gives
the median and the 90th percentile in milliseconds. A row with the limits off
(no limit in force) is the baseline. Each size gets a fresh scratch database. Run it against
another checkout with ``--code PATH`` (its ``django_jobs`` is imported instead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS = {
    "postgresql": "postgres://postgres@127.0.0.1:5432/{db}",
    "mariadb": "mysql://root@127.0.0.1:3306/{db}",
}
DB = "bench_ratelimit_claims"
LABELS = {"off": "off", "on": "on, unlimited runs due", "empty": "on, nothing else due"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=sorted(SERVERS), default="postgresql")
    parser.add_argument("--held", default="0,600,10000,100000")
    parser.add_argument("--claims", type=int, default=20)
    parser.add_argument("--code", default=os.path.dirname(HERE), help="checkout to measure")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one measurement
    args = parser.parse_args()
    if args.one is not None:
        measure(args)
        return
    print(f"| held runs | limits | claim ms, median | p90 | runs claimed |  ({args.database})")
    print("|---|---|---|---|---|")
    for held in [int(n) for n in args.held.split(",")]:
        for limits in ("off", "on") if held == 0 else ("on", "empty"):
            env = dict(
                os.environ,
                BENCH_DATABASE_URL=SERVERS[args.database].format(db=DB),
                BENCH_RATE_LIMIT="1/h",
                PYTHONPATH=os.pathsep.join([args.code, HERE]),
                DJANGO_SETTINGS_MODULE="project.settings",
            )
            one = [sys.executable, __file__, "--one", f"{held}:{limits}"]
            one += ["--database", args.database, "--claims", str(args.claims)]
            subprocess.run(one, env=env, check=True)


def measure(args: argparse.Namespace) -> None:
    held_text, limits_on = args.one.split(":")
    held = int(held_text)
    recreate(args.database)
    import django

    django.setup()
    from datetime import timedelta

    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_jobs import start_many
    from django_jobs.models import JobRun
    from django_jobs.ratelimits import in_force
    from django_jobs.registry import all_handlers
    from django_jobs.storage.claiming import claim_batch
    from django_jobs.storage.workers import register_worker

    call_command("migrate", verbosity=0)
    limits = in_force(all_handlers(), ["default"]) if limits_on != "off" else None
    plain = 0 if limits_on == "empty" else 16 * (args.claims + 1)
    worker = register_worker("bench", os.getpid(), ["default"], 16).pk
    if held:
        for first in range(0, held, 20_000):
            start_many("bench.limited", [{}] * min(20_000, held - first))
        JobRun.objects.filter(job_type="bench.limited").update(
            run_at=timezone.now() - timedelta(minutes=1)
        )
        # The window's one start: every other limited run is held from now on.
        assert len(claim_batch(worker, ["default"], 1, limits=limits)) == 1
    if plain:
        start_many("bench.noop", [{}] * plain)
    analyze = "ANALYZE" if connection.vendor == "postgresql" else "ANALYZE TABLE django_jobs_jobrun"
    with connection.cursor() as cursor:
        cursor.execute(analyze)
    claim_batch(worker, ["default"], 16, limits=limits)  # planned and warm
    took, claimed = [], 0
    for _ in range(args.claims):
        began = time.perf_counter()
        batch = claim_batch(worker, ["default"], 16, limits=limits)
        took.append((time.perf_counter() - began) * 1000)
        claimed += len(batch)
        assert all(claim.job_type == "bench.noop" for claim in batch)
    p90 = statistics.quantiles(took, n=10)[-1]
    print(
        f"| {held:,} | {LABELS[limits_on]} | {statistics.median(took):.2f} | {p90:.2f} | "
        f"{claimed}/{16 * args.claims if plain else 0} |",
        flush=True,
    )


def recreate(database: str) -> None:
    if database == "postgresql":
        import psycopg

        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {DB}")
    else:
        import MySQLdb

        c = MySQLdb.connect(host="127.0.0.1", user="root")
        c.cursor().execute(f"DROP DATABASE IF EXISTS {DB}")
        c.cursor().execute(f"CREATE DATABASE {DB} CHARACTER SET utf8mb4")
        c.close()


if __name__ == "__main__":
    main()
