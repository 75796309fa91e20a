"""Handlers the tests run; each records its calls in Execution when asked to."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

from django.utils import timezone

from django_jobs import JobContext, RetryPolicy, job

from .models import Execution

if os.environ.get("DJANGO_JOBS_RETENTION_INTERVAL"):
    # Worker subprocesses of test_retention_process prune every few tenths of a
    # second rather than every few minutes (not a setting: this module is
    # imported by every worker at its start, before its threads begin).
    from django_jobs import retention

    retention.INTERVAL = float(os.environ["DJANGO_JOBS_RETENTION_INTERVAL"])


class PermanentError(Exception):
    """Raised by a handler that must not be retried."""


class CodedError(Exception):
    code = "E_CARD_DECLINED"


def record(ctx: JobContext) -> None:
    Execution.objects.create(
        run_id=ctx.run_id, job_type=ctx.job_type, attempt=ctx.attempt, pid=os.getpid()
    )


@job("tests.noop")
def noop(ctx: JobContext) -> None:
    return None


@job("tests.echo", pool="echo")
def echo(ctx: JobContext) -> Any:
    return ctx.input


@job("tests.record")
def record_run(ctx: JobContext) -> dict[str, int]:
    record(ctx)
    return {"attempt": ctx.attempt}


@job("tests.flaky", retry=RetryPolicy(attempts=3, base_delay=0, jitter=False))
def flaky(ctx: JobContext) -> dict[str, int]:
    """Fail until the attempt given as input["succeed_on"]."""
    record(ctx)
    if ctx.attempt < ctx.input.get("succeed_on", 99):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@job(
    "tests.permanent",
    retry=RetryPolicy(attempts=5, base_delay=0, non_retryable=[PermanentError, "E_CARD_DECLINED"]),
)
def permanent(ctx: JobContext) -> None:
    record(ctx)
    if ctx.input.get("coded"):
        raise CodedError("card declined")
    raise PermanentError("this will never work")


@job("tests.backoff", retry=RetryPolicy(attempts=3, base_delay=3600, jitter=False))
def backoff(ctx: JobContext) -> None:
    raise RuntimeError("try again in an hour")


@job("tests.sleep", retry=RetryPolicy(attempts=3, base_delay=0))
def sleep(ctx: JobContext) -> dict[str, float]:
    record(ctx)
    time.sleep(ctx.input.get("seconds", 1.0))
    return {"slept": ctx.input.get("seconds", 1.0)}


@job("tests.poison", retry=RetryPolicy(attempts=2, base_delay=0))
def poison(ctx: JobContext) -> None:
    """Kill the worker process running it, as an out-of-memory kill would."""
    record(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


@job("tests.bad_output")
def bad_output(ctx: JobContext) -> object:
    return object()


@job("tests.system_exit")
def system_exit(ctx: JobContext) -> None:
    raise SystemExit(3)


@job("tests.priority", pool="prio")
def priority(ctx: JobContext) -> None:
    record(ctx)


# --- durable execution ----------------------------------------------------------------


def effect(ctx: JobContext, name: str) -> int:
    """A side effect a step performs: one Execution row named after it."""
    row = Execution.objects.create(
        run_id=ctx.run_id, job_type=f"effect:{name}", attempt=ctx.attempt, pid=os.getpid()
    )
    return row.pk


@job("tests.three_steps", retry=RetryPolicy(attempts=3, base_delay=0))
def three_steps(ctx: JobContext) -> dict[str, Any]:
    """Three steps; the third can sleep (to be killed mid-step) or fail on early attempts."""
    a = ctx.step("a", lambda: effect(ctx, "a"))
    b = ctx.step("b", lambda: effect(ctx, "b"))

    def third() -> int:
        effect(ctx, "c-started")
        time.sleep(ctx.input.get("sleep_in_c", 0))
        if ctx.attempt < ctx.input.get("fail_c_until", 0):
            raise RuntimeError("step c failed")
        return effect(ctx, "c")

    c = ctx.step("c", third)
    return {"a": a, "b": b, "c": c}


@job("tests.loop_steps", retry=RetryPolicy(attempts=2, base_delay=0))
def loop_steps(ctx: JobContext) -> list[int]:
    sent = [ctx.step("send", lambda: effect(ctx, "send")) for _ in range(3)]
    if ctx.attempt == 1:
        raise RuntimeError("fail after the loop")
    return sent


@job("tests.atomic_step", retry=RetryPolicy(attempts=2, base_delay=0))
def atomic_step(ctx: JobContext) -> int:
    row = ctx.step("write", lambda: effect(ctx, "write"), atomic=True)
    if ctx.attempt == 1:
        raise RuntimeError("fail after the atomic step")
    return row


@job("tests.atomic_step_fails", retry=RetryPolicy(attempts=2, base_delay=0))
def atomic_step_fails(ctx: JobContext) -> int:
    def write_then_fail() -> int:
        row = effect(ctx, "write")
        if ctx.attempt == 1:
            raise RuntimeError("fail inside the atomic step")
        return row

    return ctx.step("write", write_then_fail, atomic=True)


@job("tests.bad_step", retry=RetryPolicy(attempts=3, base_delay=0))
def bad_step(ctx: JobContext) -> None:
    ctx.step("unstorable", object)


@job("tests.parent", retry=RetryPolicy(attempts=2, base_delay=0))
def parent(ctx: JobContext) -> dict[str, Any]:
    """Spawn input["n"] children, optionally fail once after spawning, then wait for them."""
    effect(ctx, "parent-body")
    children = [
        ctx.spawn_child(ctx.input.get("child", "tests.echo"), {"i": i})
        for i in range(ctx.input.get("n", 2))
    ]
    if ctx.input.get("fail_first") and ctx.attempt == 1:
        raise RuntimeError("fail after spawning")
    outputs = ctx.wait_for(children)
    return {"children": [c.pk for c in children], "outputs": outputs}


@job("tests.parent_of_failure")
def parent_of_failure(ctx: JobContext) -> str:
    child = ctx.spawn_child("tests.permanent", {})
    try:
        ctx.wait_for([child])
    except Exception as exc:
        return type(exc).__name__
    return "no error"


@job("tests.sleeper")
def sleeper(ctx: JobContext) -> str:
    ctx.step("before", lambda: effect(ctx, "before"))
    ctx.sleep("nap", ctx.input.get("seconds", 0.5))
    ctx.step("after", lambda: effect(ctx, "after"))
    return "rested"


@job("tests.cooperative")
def cooperative(ctx: JobContext) -> str:
    effect(ctx, "cooperative")
    deadline = time.monotonic() + ctx.input.get("seconds", 30)
    while time.monotonic() < deadline:
        ctx.check_cancel()
        time.sleep(0.05)
    return "finished"


@job("tests.ignoring")
def ignoring(ctx: JobContext) -> str:
    effect(ctx, "ignoring")
    time.sleep(ctx.input.get("seconds", 5))
    return "finished anyway"


@job("tests.slow", timeout=0.5)
def slow(ctx: JobContext) -> str:
    effect(ctx, "slow")
    time.sleep(ctx.input.get("seconds", 3))
    return "too late"


@job("tests.timed_cooperative", timeout=0.3, retry=RetryPolicy(attempts=2, base_delay=0))
def timed_cooperative(ctx: JobContext) -> str:
    """Checks for cancellation in a loop, as docs/cancellation.md advises, past its timeout."""
    effect(ctx, "start")
    deadline = time.monotonic() + ctx.input.get("seconds", 3)
    while time.monotonic() < deadline:
        ctx.check_cancel()
        time.sleep(0.005)
    return "too late"


@job("tests.gil_hog", retry=RetryPolicy(attempts=3, base_delay=0))
def gil_hog(ctx: JobContext) -> str:
    """One C call that holds the GIL for about ``seconds`` (``sum`` over a range)."""
    effect(ctx, "start")
    started = time.perf_counter()
    sum(range(2_000_000))
    per_item = (time.perf_counter() - started) / 2_000_000
    sum(range(int(ctx.input.get("seconds", 6) / per_item)))
    effect(ctx, "end")
    return "done"


@job("tests.keyed", concurrency_key=lambda input: input.get("key"))
def keyed(ctx: JobContext) -> None:
    row = Execution.objects.create(
        run_id=ctx.run_id, job_type="keyed", attempt=ctx.attempt, pid=os.getpid()
    )
    time.sleep(ctx.input.get("seconds", 0.02))
    Execution.objects.filter(pk=row.pk).update(finished_at=timezone.now())


@job(
    "tests.keyed_retried",
    concurrency_key=lambda input: input.get("key"),
    retry=RetryPolicy(attempts=20, base_delay=0),
)
def keyed_retried(ctx: JobContext) -> str:
    """``tests.keyed`` that a kill storm cannot fail: its attempts outlast the kills.
    The execution's job type names the key, for the overlap check."""
    row = Execution.objects.create(
        run_id=ctx.run_id,
        job_type=f"keyed:{ctx.input['key']}",
        attempt=ctx.attempt,
        pid=os.getpid(),
    )
    time.sleep(ctx.input.get("seconds", 0.02))
    Execution.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return "done"


@job(
    "tests.limited_retried",
    concurrency_key=lambda input: input.get("key"),
    concurrency_limit=3,
    retry=RetryPolicy(attempts=20, base_delay=0),
)
def limited_retried(ctx: JobContext) -> str:
    """``tests.keyed_retried`` with three runs of a key at once."""
    return keyed_retried(ctx)  # type: ignore[no-any-return]


@job("tests.tenanted_retried", retry=RetryPolicy(attempts=20, base_delay=0))
def tenanted_retried(ctx: JobContext) -> str:
    """``tests.keyed_retried`` without a key: its runs are limited by their tenant's cap."""
    return keyed_retried(ctx)  # type: ignore[no-any-return]


@job("tests.chaos", retry=RetryPolicy(attempts=20, base_delay=0))
def chaos(ctx: JobContext) -> int:
    """Three steps with a side effect and a pause each: a target for kill storms."""
    total = 0
    for name in ("a", "b", "c"):

        def work(name: str = name) -> int:
            effect(ctx, name)
            time.sleep(ctx.input.get("pause", 0.05))
            return 1

        total += ctx.step(name, work)
    return total


@job("tests.progress")
def progress(ctx: JobContext) -> int:
    """Report progress over ``items`` items, with a message at the end."""
    items = ctx.input.get("items", 3)
    for done in range(1, items + 1):
        ctx.set_progress(done, items, message="" if done < items else "all done")
    return items


@job("tests.progress_held", retry=RetryPolicy(attempts=2, base_delay=3600, jitter=False))
def progress_held(ctx: JobContext) -> int:
    """Report 1 then 2 of 10 at once (the 2 held back by the throttle), then maybe fail."""
    ctx.set_progress(1, 10)
    ctx.set_progress(2, 10)
    if ctx.input.get("fail"):
        raise RuntimeError("failed after reporting progress")
    return 2


@job("tests.loud_failure")
def loud_failure(ctx: JobContext) -> None:
    """Fails with a message of ``input["size"]`` characters, as a careless handler might."""
    raise ValueError("x" * ctx.input["size"])


@job("tests.says")
def says(ctx: JobContext) -> None:
    """Logs each of ``input["lines"]``, ``[where, text]``: on its run's logger (``run``),
    or as a warning of a logger of the project's own that no LOGGING configures."""
    for where, text in ctx.input["lines"]:
        if where == "run":
            ctx.logger.info("%s", text)
        else:
            logging.getLogger("tests.testapp.elsewhere").warning("%s", text)


@job("tests.fails_with")
def fails_with(ctx: JobContext) -> None:
    """Fails with ``input["message"]`` repeated ``input["times"]`` times, as a handler
    quoting what a caller sent (an e-mail address, an API's answer) might."""
    raise ValueError(ctx.input["message"] * ctx.input.get("times", 1))


# --- async def handlers (docs/async.md): the same semantics on the worker's event loop ---


async def aeffect(ctx: JobContext, name: str) -> int:
    """``effect`` from async code, through the async ORM."""
    row = await Execution.objects.acreate(
        run_id=ctx.run_id, job_type=f"effect:{name}", attempt=ctx.attempt, pid=os.getpid()
    )
    return row.pk


@job("tests.async_echo")
async def async_echo(ctx: JobContext) -> Any:
    await asyncio.sleep(ctx.input.get("seconds", 0))
    return ctx.input


# How many tests.async_three_steps runs are in their step c in this process.
in_step_c = {"now": 0}


@job("tests.async_three_steps", retry=RetryPolicy(attempts=3, base_delay=0))
async def async_three_steps(ctx: JobContext) -> dict[str, Any]:
    """``three_steps`` in async code: an async step, a sync one (the ORM), an awaited one."""
    a = await ctx.astep("a", lambda: aeffect(ctx, "a"))
    b = await ctx.astep("b", lambda: effect(ctx, "b"))

    async def third() -> int:
        await aeffect(ctx, "c-started")
        in_step_c["now"] += 1
        try:
            await asyncio.sleep(ctx.input.get("sleep_in_c", 0))
            # Wait (up to 60 s) until this many runs are in step c in this process.
            deadline = time.monotonic() + 60
            while in_step_c["now"] < ctx.input.get("together_in_c", 0):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
        finally:
            in_step_c["now"] -= 1
        if ctx.attempt < ctx.input.get("fail_c_until", 0):
            raise RuntimeError("step c failed")
        return await aeffect(ctx, "c")

    c = await ctx.astep("c", third)
    return {"a": a, "b": b, "c": c}


@job("tests.async_atomic_step", retry=RetryPolicy(attempts=2, base_delay=0))
async def async_atomic_step(ctx: JobContext) -> int:
    """An atomic async step whose ORM write is rolled back with it when it fails."""

    async def write_then_fail() -> int:
        row = await aeffect(ctx, "write")
        if ctx.attempt == 1:
            raise RuntimeError("fail inside the atomic step")
        return row

    row: int = await ctx.astep("write", write_then_fail, atomic=True)
    return row


@job("tests.async_parent", retry=RetryPolicy(attempts=2, base_delay=0))
async def async_parent(ctx: JobContext) -> dict[str, Any]:
    await aeffect(ctx, "parent-body")
    children = [
        await ctx.aspawn_child(ctx.input.get("child", "tests.async_echo"), {"i": i})
        for i in range(ctx.input.get("n", 2))
    ]
    if ctx.input.get("fail_first") and ctx.attempt == 1:
        raise RuntimeError("fail after spawning")
    outputs = await ctx.await_for(children)
    return {"children": [c.pk for c in children], "outputs": outputs}


@job("tests.async_parent_of_failure")
async def async_parent_of_failure(ctx: JobContext) -> str:
    child = await ctx.aspawn_child("tests.permanent", {})
    try:
        await ctx.await_for([child])
    except Exception as exc:
        return type(exc).__name__
    return "no error"


@job("tests.async_sleeper")
async def async_sleeper(ctx: JobContext) -> str:
    await ctx.astep("before", lambda: aeffect(ctx, "before"))
    await ctx.asleep("nap", ctx.input.get("seconds", 0.5))
    await ctx.astep("after", lambda: aeffect(ctx, "after"))
    return "rested"


@job("tests.async_cooperative")
async def async_cooperative(ctx: JobContext) -> str:
    await aeffect(ctx, "cooperative")
    deadline = time.monotonic() + ctx.input.get("seconds", 30)
    while time.monotonic() < deadline:
        ctx.check_cancel()
        await asyncio.sleep(0.05)
    return "finished"


@job("tests.async_ignoring")
async def async_ignoring(ctx: JobContext) -> str:
    """Ignores a cancel request; its task is canceled after the grace, so "late" never happens."""
    await aeffect(ctx, "ignoring")
    await asyncio.sleep(ctx.input.get("seconds", 5))
    await aeffect(ctx, "late")
    return "finished anyway"


@job("tests.async_slow", timeout=0.5)
async def async_slow(ctx: JobContext) -> str:
    await aeffect(ctx, "slow")
    await asyncio.sleep(ctx.input.get("seconds", 3))
    await aeffect(ctx, "late")
    return "too late"


@job("tests.async_keyed", concurrency_key=lambda input: input.get("key"))
async def async_keyed(ctx: JobContext) -> None:
    row = await Execution.objects.acreate(
        run_id=ctx.run_id, job_type="keyed", attempt=ctx.attempt, pid=os.getpid()
    )
    await asyncio.sleep(ctx.input.get("seconds", 0.02))
    await Execution.objects.filter(pk=row.pk).aupdate(finished_at=timezone.now())


# How many tests.async_together runs this process runs at this moment, and the most seen.
together = {"now": 0, "most": 0}


@job("tests.async_together")
async def async_together(ctx: JobContext) -> int:
    """Wait (up to ``timeout`` seconds) until ``n`` runs of this type run at once in
    this process; return the most seen. Shows runs overlapping without timing them."""
    together["now"] += 1
    together["most"] = max(together["most"], together["now"])
    try:
        deadline = time.monotonic() + ctx.input.get("timeout", 20)
        while together["most"] < ctx.input["n"] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return together["most"]
    finally:
        together["now"] -= 1


@job("tests.async_sync_step")
async def async_sync_step(ctx: JobContext) -> None:
    """Calls the sync ctx.step by mistake."""
    ctx.step("oops", lambda: 1)


@job("tests.async_progress")
async def async_progress(ctx: JobContext) -> int:
    items = ctx.input.get("items", 3)
    for done in range(1, items + 1):
        await ctx.aset_progress(done, items, message="" if done < items else "all done")
    return items


@job("tests.async_chaos", retry=RetryPolicy(attempts=20, base_delay=0))
async def async_chaos(ctx: JobContext) -> int:
    """``chaos`` as an async handler: three steps, each an async ORM write and a pause."""
    total = 0
    for name in ("a", "b", "c"):

        async def work(name: str = name) -> int:
            await aeffect(ctx, name)
            await asyncio.sleep(ctx.input.get("pause", 0.05))
            return 1

        total += await ctx.astep(name, work)
    return total


@job("tests.limited", pool="ratelimited", rate_limit="20/s")
def limited(ctx: JobContext) -> None:
    """At most 20 start per second, across every worker (the rate limit tests)."""
    time.sleep(ctx.input.get("seconds", 0))


@job(
    "tests.limited_per_key",
    pool="ratelimited",
    rate_limit="2/h",
    rate_limit_key=lambda input: input.get("customer") and f"customer:{input['customer']}",
)
def limited_per_key(ctx: JobContext) -> None:
    """At most 2 start per hour per customer; a run without one is not limited."""


@job("tests.limited_async", pool="ratelimited", rate_limit="20/s")
async def limited_async(ctx: JobContext) -> None:
    """``tests.limited`` as an async handler: claimed for the event loop, limited alike."""
    await asyncio.sleep(ctx.input.get("seconds", 0))


def _event_options(ctx: JobContext) -> dict[str, Any]:
    return {key: ctx.input[key] for key in ("timeout", "default") if key in ctx.input}


@job("tests.approval", retry=RetryPolicy(attempts=3, base_delay=0))
def approval(ctx: JobContext) -> list[Any]:
    """Waits for ``count`` events ``event`` (``approved``), each recorded in
    Execution once taken; fails its first attempt after them when ``fail_once``."""
    name = ctx.input.get("event", "approved")
    taken = []
    for _ in range(ctx.input.get("count", 1)):
        taken.append(ctx.wait_for_event(name, **_event_options(ctx)))
        record(ctx)
        time.sleep(ctx.input.get("sleep_after", 0))
    if ctx.input.get("fail_once") and ctx.attempt == 1:
        raise RuntimeError("after the events")
    return taken


@job("tests.async_approval")
async def async_approval(ctx: JobContext) -> list[Any]:
    name = ctx.input.get("event", "approved")
    return [
        await ctx.await_event(name, **_event_options(ctx)) for _ in range(ctx.input.get("count", 1))
    ]


@job("tests.waits_inside")
def waits_inside(ctx: JobContext) -> Any:
    """Blocks on another run from inside a handler: refused."""
    from django_jobs.models import JobRun

    return JobRun.objects.get(pk=ctx.input["run"]).wait(timeout=1)


@job("tests.event_then_hang", timeout=1)
def event_then_hang(ctx: JobContext) -> None:
    """Takes an event already sent (no suspension), then outlives its timeout."""
    ctx.wait_for_event("go")
    record(ctx)
    time.sleep(ctx.input.get("seconds", 5))
