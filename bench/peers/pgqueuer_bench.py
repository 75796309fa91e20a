"""PgQueuer driver: drain1 (bulk enqueue, 1 worker process, idle latency) and drain2
(2 worker processes). Bulk enqueue = ``Queries.enqueue`` with lists (one statement).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import asyncpg
import common
from pgqueuer import AsyncpgDriver, Queries

DB = "bench_run_pgqueuer"
LAT_FILE = f"/tmp/{DB}_lat.txt"
HERE = os.path.dirname(os.path.abspath(__file__))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    common.recreate_db(DB)
    common.fresh_file(LAT_FILE)
    env = {"BENCH_PG_URL": common.url(DB), "BENCH_LAT_FILE": LAT_FILE}
    pgq = os.path.join(os.path.dirname(sys.executable), "pgq")
    subprocess.run(
        [pgq, "--pg-dsn", common.url(DB), "install"],
        check=True,
        capture_output=True,
        env=dict(os.environ, **env),
    )
    workers_n = 2 if args.case == "drain2" else 1
    record: dict[str, Any] = {"workers": workers_n, "config": "pgqueuer.run defaults"}
    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(asyncpg.connect(common.url(DB)))
    queries = Queries(AsyncpgDriver(conn))
    try:
        n = args.n
        t = time.perf_counter()
        loop.run_until_complete(queries.enqueue(["noop"] * n, [None] * n, [0] * n))
        seconds = time.perf_counter() - t
        record.update(enqueue_s=round(seconds, 3), enqueue_per_s=round(n / seconds, 1))
        common.scalar(DB, "VACUUM ANALYZE pgqueuer")
        # Finished jobs leave the queue table for pgqueuer_log.
        done_sql = f"SELECT {n} - count(*) FROM pgqueuer WHERE entrypoint = 'noop'"
        cmd = [sys.executable, os.path.join(HERE, "pgqueuer_app.py")]
        with common.Workers(f"pgqueuer_{args.case}", [cmd] * workers_n, HERE, env) as workers:
            with common.LoadMonitor() as load:
                record.update(common.wait_drained(DB, done_sql, n, workers))
            record.update(load.result)
            span = common.scalar(
                DB,
                "SELECT extract(epoch FROM"
                " max(created) FILTER (WHERE status = 'successful')"
                " - min(created) FILTER (WHERE status = 'picked'))"
                " FROM pgqueuer_log WHERE entrypoint = 'noop'",
            )
            record["drain_db_per_s"] = round(n / float(span), 1) if span else None
            failed = common.scalar(
                DB, "SELECT count(*) FROM pgqueuer_log WHERE status IN ('exception', 'canceled')"
            )
            if failed:
                raise RuntimeError(f"{failed} jobs did not succeed")
            if args.case == "drain1":

                def probe(tag: str) -> None:
                    loop.run_until_complete(queries.enqueue("latency", tag.encode()))

                record["warmup_probe_s"] = common.wait_started(LAT_FILE, probe)
                record.update(common.measure_latency(probe, LAT_FILE, args.lat_samples))
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
    return record


if __name__ == "__main__":
    common.driver_main(measure)
