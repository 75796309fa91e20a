"""PgQueuer driver: drain1 (bulk enqueue, 1 worker process, idle latency), drain2
(2 worker processes) and io (N runs of the ``io`` entrypoint, each awaiting 0.1 s, by
one worker with ``max_concurrent_tasks`` C). Bulk enqueue = ``Queries.enqueue`` with
lists (one statement).

PgQueuer's worker has no concurrency setting of its own: each pass of its loop dequeues
batches (``batch_size``, 10 by default) until a dequeue comes back empty and starts a
task per job, so by default one worker takes the whole backlog at once.
``max_concurrent_tasks`` (``pgq run --max-concurrent-tasks``) caps the jobs it holds
picked, in the dequeue query itself; it must be at least twice the batch size. (An
entrypoint's ``concurrency_limit`` is a cap across all workers, counted in SQL.) The io
case sets ``max_concurrent_tasks`` to C and the batch size to IO_BATCH_SIZE.
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
# The io case's batch size, at most C / 2. At C = 500 the default, 10, drained 5,000 io
# runs in 2.1-3.4 s (DB span); 25, 50 and 100 in 1.4-1.7 s, 100 best by a little,
# 250 in 1.6-1.7 s (December 2026, this machine): PgQueuer gets its best.
IO_BATCH_SIZE = 100


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
    io = args.case == "io"
    entrypoint = "io" if io else "noop"
    cmd = [sys.executable, os.path.join(HERE, "pgqueuer_app.py")]
    config = "pgqueuer.run defaults"
    if io:
        if args.io_concurrency < 2:
            raise ValueError("PgQueuer's max_concurrent_tasks is at least 2 (twice a batch)")
        batch = min(IO_BATCH_SIZE, args.io_concurrency // 2)
        options = {"--batch-size": batch, "--max-concurrent-tasks": args.io_concurrency}
        cmd += [str(x) for item in options.items() for x in item]
        config = f"max_concurrent_tasks={args.io_concurrency}, batch_size={batch}"
    record: dict[str, Any] = {"workers": workers_n, "config": config}
    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(asyncpg.connect(common.url(DB)))
    queries = Queries(AsyncpgDriver(conn))
    try:
        n = args.n
        t = time.perf_counter()
        loop.run_until_complete(queries.enqueue([entrypoint] * n, [None] * n, [0] * n))
        seconds = time.perf_counter() - t
        record.update(enqueue_s=round(seconds, 3), enqueue_per_s=round(n / seconds, 1))
        common.scalar(DB, "VACUUM ANALYZE pgqueuer")
        # Finished jobs leave the queue table for pgqueuer_log.
        done_sql = f"SELECT {n} - count(*) FROM pgqueuer WHERE entrypoint = '{entrypoint}'"
        with common.Workers(f"pgqueuer_{args.case}", [cmd] * workers_n, HERE, env) as workers:
            pgids = [p.pid for p in workers.procs]
            poll = common.IO_POLL if io else common.POLL
            sampler = common.ConnectionSampler(pgids, enabled=io)
            with common.LoadMonitor() as load, sampler:
                record.update(common.wait_drained(DB, done_sql, n, workers, poll=poll))
            record.update(load.result, **sampler.result)
            span = common.scalar(
                DB,
                "SELECT extract(epoch FROM"
                " max(created) FILTER (WHERE status = 'successful')"
                " - min(created) FILTER (WHERE status = 'picked'))"
                f" FROM pgqueuer_log WHERE entrypoint = '{entrypoint}'",
            )
            span = float(span) if span else None
            if io:
                record.update(common.io_figures(n, args.io_concurrency, span))
            else:
                record["drain_db_per_s"] = round(n / span, 1) if span else None
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
