"""The Procrastinate side of the benchmark: an App with a no-op, a latency and an io task."""

from __future__ import annotations

import asyncio
import os
import time

from procrastinate import App, PsycopgConnector

IO_SECONDS = 0.1  # the io case's simulated I/O (bench/peers/common.py: IO_SECONDS)

app = App(connector=PsycopgConnector(conninfo=os.environ["BENCH_PG_DSN"]))


@app.task(name="noop")
def noop() -> None:
    return None


@app.task(name="latency")
def latency(tag: str) -> None:
    with open(os.environ["BENCH_LAT_FILE"], "a") as f:
        f.write(f"{tag} {time.time()}\n")


@app.task(name="io")
async def io() -> None:
    await asyncio.sleep(IO_SECONDS)
