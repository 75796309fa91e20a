"""The Procrastinate side of the benchmark: an App with a no-op and a latency task."""

from __future__ import annotations

import os
import time

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ["BENCH_PG_DSN"]))


@app.task(name="noop")
def noop() -> None:
    return None


@app.task(name="latency")
def latency(tag: str) -> None:
    with open(os.environ["BENCH_LAT_FILE"], "a") as f:
        f.write(f"{tag} {time.time()}\n")
