"""Procrastinate driver: drain1 (bulk enqueue with ``batch_defer``, one
``procrastinate worker --concurrency 10`` process, idle latency) and drain2 (2 processes).
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
    record: dict[str, Any] = {"workers": workers_n, "config": f"--concurrency {CONCURRENCY}"}
    n = args.n
    with procrastinate_app.app.open():
        t = time.perf_counter()
        procrastinate_app.noop.batch_defer(*([{}] * n))
        seconds = time.perf_counter() - t
        record.update(enqueue_s=round(seconds, 3), enqueue_per_s=round(n / seconds, 1))
        common.scalar(DB, "VACUUM ANALYZE procrastinate_jobs")
        done_sql = (
            "SELECT count(*) FROM procrastinate_jobs"
            " WHERE task_name = 'noop' AND status IN ('succeeded', 'failed')"
        )
        cmd = [*cli, "worker", f"--concurrency={CONCURRENCY}"]
        with common.Workers(f"procrastinate_{args.case}", [cmd] * workers_n, HERE, env) as workers:
            with common.LoadMonitor() as load:
                record.update(common.wait_drained(DB, done_sql, n, workers))
            record.update(load.result)
            span = common.scalar(
                DB,
                "SELECT extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')"
                " - min(e.at) FILTER (WHERE e.type = 'started'))"
                " FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id"
                " WHERE j.task_name = 'noop'",
            )
            record["drain_db_per_s"] = round(n / float(span), 1) if span else None
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
