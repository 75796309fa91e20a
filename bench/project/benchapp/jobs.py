"""The benchmark's handlers: a no-op, a three-step run, and a latency probe."""

from __future__ import annotations

import os
import time
from typing import Any

from django_jobs import JobContext, job


@job("bench.noop")
def noop(ctx: JobContext) -> None:
    return None


@job("bench.steps")
def steps(ctx: JobContext) -> int:
    total = 0
    for name in ("a", "b", "c"):
        total += ctx.step(name, lambda: 1)
    return total


@job("bench.latency")
def latency(ctx: JobContext) -> Any:
    with open(os.environ["BENCH_LAT_FILE"], "a") as f:
        f.write(f"{ctx.input['tag']} {time.time()}\n")
