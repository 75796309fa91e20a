"""The PgQueuer side of the benchmark: a factory with the no-op and latency entrypoints,
and (run as a script) a worker started as ``pgq run pgqueuer_app:create`` would be.

``pgq run`` itself fails in pgqueuer 1.6.0 with typer 0.29.2 (its --log-level parser
hands a str to setup_fancy_logger, which wants a LogLevel), so the script does what the
command does with its default options: INFO logging, then ``pgqueuer.run`` (batch size
10, dequeue timeout 30 s, continuous mode) on uvloop.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer


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

    try:
        yield pgq
    finally:
        await conn.close()


if __name__ == "__main__":
    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run
    from pgqueuer.core import logconfig

    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    asyncio_run(pgqueuer.run(create))
