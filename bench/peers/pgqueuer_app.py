"""The PgQueuer side of the benchmark: a factory with the no-op, latency and io
entrypoints, and (run as a script) a worker started as ``pgq run pgqueuer_app:create``
would be.

``pgq run`` itself fails in pgqueuer 1.6.0 with typer 0.29.2 (its --log-level parser
hands a str to setup_fancy_logger, which wants a LogLevel), so the script does what the
command does: INFO logging, then ``pgqueuer.run`` (dequeue timeout 30 s, continuous
mode) on uvloop, with the command's defaults (batch size 10, no cap on the jobs in
flight) unless ``--batch-size`` or ``--max-concurrent-tasks`` say otherwise (the
options of ``pgq run`` of the same names).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer

IO_SECONDS = 0.1  # the io case's simulated I/O (bench/peers/common.py: IO_SECONDS)


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    conn = await asyncpg.connect(os.environ["BENCH_PG_URL"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @pgq.entrypoint("latency")
    async def latency(job: Job) -> None:
        with open(os.environ["BENCH_LAT_FILE"], "a") as f:
            f.write(f"{(job.payload or b'').decode()} {time.time()}\n")

    @pgq.entrypoint("io")
    async def io(job: Job) -> None:
        await asyncio.sleep(IO_SECONDS)

    try:
        yield pgq
    finally:
        await conn.close()


if __name__ == "__main__":
    import argparse

    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run
    from pgqueuer.core import logconfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--max-concurrent-tasks", type=int, default=None)
    args = parser.parse_args()
    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    asyncio_run(
        pgqueuer.run(
            create,
            batch_size=args.batch_size,
            max_concurrent_tasks=args.max_concurrent_tasks,
        )
    )
