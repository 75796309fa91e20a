"""The benchmark's handlers: a no-op, a three-step run, a latency probe, the io
case's async run (0.1 s of simulated I/O), the ratelimit case's rate-limited no-op
and the held case's long runs that keep a concurrency key (or the event loop) taken."""

from __future__ import annotations

import asyncio
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


@job("bench.hold")
def hold(ctx: JobContext) -> None:
    """Keep this run's concurrency key taken until canceled (the held case)."""
    deadline = time.monotonic() + ctx.input.get("seconds", 3600)
    while time.monotonic() < deadline:
        ctx.check_cancel()
        time.sleep(0.05)


@job("bench.latency")
def latency(ctx: JobContext) -> Any:
    with open(os.environ["BENCH_LAT_FILE"], "a") as f:
        f.write(f"{ctx.input['tag']} {time.time()}\n")


# The io case's handler, registered only in that case's processes (BENCH_IO=1, set by
# bench/peers/django_jobs_bench.py), so that the other cases keep measuring a project
# of sync handlers. With an async handler registered a worker also claims for its
# event loop: at 2e31825 that cut drain1 about 20x, at 2861a2b a sync run's idle
# latency p50 was 32-47 ms; since 725f3cc drain1 and its latency are what they are
# without it (6,947 runs/s and 4.9 ms with BENCH_IO=1 set for the whole run;
# docs/performance.md).
if os.environ.get("BENCH_IO") == "1":

    @job("bench.io")
    async def io(ctx: JobContext) -> None:
        await asyncio.sleep(0.1)  # bench/peers/common.py: IO_SECONDS


# The ratelimit case's no-op under a rate limit of BENCH_RATE_LIMIT ("20/s"), registered
# only in that case's processes (set by bench/peers/django_jobs_bench.py, as BENCH_IO
# is), so that the other cases' workers claim with no limit in force.
if os.environ.get("BENCH_RATE_LIMIT"):

    @job("bench.limited", rate_limit=os.environ["BENCH_RATE_LIMIT"])
    def limited(ctx: JobContext) -> None:
        return None


# The held case's "kind" backlog (BENCH_ASYNC_HOLD=1, set by
# bench/peers/django_jobs_bench.py): an async run that keeps a worker's one async
# slot taken until canceled, and the async no-op of the backlog behind it.
if os.environ.get("BENCH_ASYNC_HOLD") == "1":

    @job("bench.ahold")
    async def ahold(ctx: JobContext) -> None:
        deadline = time.monotonic() + ctx.input.get("seconds", 3600)
        while time.monotonic() < deadline:
            ctx.check_cancel()
            await asyncio.sleep(0.05)

    @job("bench.anoop")
    async def anoop(ctx: JobContext) -> None:
        return None


@job("bench.await_event")
def await_event(ctx: JobContext) -> None:
    """The events case: waits for the event ``go``; a payload with a tag marks, in the
    latency file, when the handler's next line ran."""
    payload = ctx.wait_for_event("go")
    if isinstance(payload, dict) and payload.get("tag"):
        with open(os.environ["BENCH_LAT_FILE"], "a") as f:
            f.write(f"{payload['tag']} {time.time()}\n")
