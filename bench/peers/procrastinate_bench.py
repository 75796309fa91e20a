"""Procrastinate driver: drain1 (bulk enqueue with ``batch_defer``, one
``procrastinate worker --concurrency 10`` process, idle latency), drain2 (2 processes)
and io (N runs of the async task ``io``, each awaiting 0.1 s, by one
``procrastinate worker --concurrency C`` process: an async task runs on the worker's
event loop, C of them at once).

The worker's connections come from the connector's psycopg pool, left at its defaults
(``PsycopgConnector(conninfo=...)``), as for the other cases.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import common

DB = "bench_run_procrastinate"
LAT_FILE = f"/tmp/{DB}_lat.txt"
HERE = os.path.dirname(os.path.abspath(__file__))
CONCURRENCY = 10  # its default is 1; 10 drained ~30 % faster in the earlier workshop runs
os.environ["BENCH_PG_DSN"] = common.dsn(DB)
os.environ["BENCH_LAT_FILE"] = LAT_FILE

import procrastinate_app  # noqa: E402  (reads the two variables above)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    common.recreate_db(DB)
    common.fresh_file(LAT_FILE)
    cli = [
        os.path.join(os.path.dirname(sys.executable), "procrastinate"),
        "--app=procrastinate_app.app",
    ]
    env = {"PYTHONPATH": HERE}
    subprocess.run(
        [*cli, "schema", "--apply"],
        check=True,
        capture_output=True,
        cwd=HERE,
        env=dict(os.environ, **env),
    )
    workers_n = 2 if args.case == "drain2" else 1
    io = args.case == "io"
    task = procrastinate_app.io if io else procrastinate_app.noop
    concurrency = args.io_concurrency if io else CONCURRENCY
    record: dict[str, Any] = {"workers": workers_n, "config": f"--concurrency {concurrency}"}
    n = args.n
    with procrastinate_app.app.open():
        t = time.perf_counter()
        task.batch_defer(*([{}] * n))
        seconds = time.perf_counter() - t
        record.update(enqueue_s=round(seconds, 3), enqueue_per_s=round(n / seconds, 1))
        common.scalar(DB, "VACUUM ANALYZE procrastinate_jobs")
        done_sql = (
            "SELECT count(*) FROM procrastinate_jobs"
            f" WHERE task_name = '{task.name}' AND status IN ('succeeded', 'failed')"
        )
        cmd = [*cli, "worker", f"--concurrency={concurrency}"]
        with common.Workers(f"procrastinate_{args.case}", [cmd] * workers_n, HERE, env) as workers:
            pgids = [p.pid for p in workers.procs]
            poll = common.IO_POLL if io else common.POLL
            sampler = common.ConnectionSampler(pgids, enabled=io)
            with common.LoadMonitor() as load, sampler:
                record.update(common.wait_drained(DB, done_sql, n, workers, poll=poll))
            record.update(load.result, **sampler.result)
            span = common.scalar(
                DB,
                "SELECT extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')"
                " - min(e.at) FILTER (WHERE e.type = 'started'))"
                " FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id"
                f" WHERE j.task_name = '{task.name}'",
            )
            span = float(span) if span else None
            if io:
                record.update(common.io_figures(n, concurrency, span))
            else:
                record["drain_db_per_s"] = round(n / span, 1) if span else None
            failed = common.scalar(
                DB, "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
            )
            if failed:
                raise RuntimeError(f"{failed} jobs did not succeed")
            if args.case == "drain1":

                def probe(tag: str) -> None:
                    procrastinate_app.latency.defer(tag=tag)

                record["warmup_probe_s"] = common.wait_started(LAT_FILE, probe)
                record.update(common.measure_latency(probe, LAT_FILE, args.lat_samples))
    return record


if __name__ == "__main__":
    common.driver_main(measure)
