"""``django.tasks`` functions the tests enqueue on JobsBackend (the "default" TASKS alias)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from django.utils import timezone

from django_jobs import RetryAfter, RetryPolicy
from django_jobs.tasks_backend import run_id as run_id_of
from django_jobs.tasks_compat import TaskContext, task

from .models import Execution


@task
def add(a: int, b: int) -> int:
    return a + b


@task()
async def add_async(a: int, b: int) -> int:
    return a + b


@task(priority=5, queue_name="tasks")
def echo(*args: Any, **kwargs: Any) -> Any:
    return {"args": args, "kwargs": kwargs}


@task
def boom(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True, retry=RetryPolicy(attempts=3, base_delay=0))
def flaky(context: TaskContext, succeed_on: int) -> dict[str, Any]:
    """Fails until attempt ``succeed_on``; returns what its context said."""
    if context.attempt < succeed_on:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(takes_context=True, retry=RetryPolicy(attempts=2, base_delay=0))
async def flaky_async(context: TaskContext, succeed_on: int) -> int:
    """``flaky`` as an async task, with two attempts."""
    if context.attempt < succeed_on:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return context.attempt


@task(takes_context=True, retry=RetryPolicy(attempts=2, base_delay=0))
def throttled(context: TaskContext) -> int:
    """Asks to be run again in ten minutes on its first attempt (an API's 429)."""
    if context.attempt == 1:
        raise RetryAfter(600, "429 Too Many Requests")
    return context.attempt


@task(retry=RetryPolicy(attempts=5, base_delay=0))
def bad_return() -> Any:
    return lambda: True


@task
def returns_bytes() -> bytes:
    return b"caf\xc3\xa9"


@task
def returns_tuple() -> tuple[int, ...]:
    return (1, 2, (3, 4))


@task(timeout=0.2)
def too_slow() -> None:
    time.sleep(0.5)


@task(concurrency_key=lambda account, amount: f"account:{account}")
def debit(account: int, amount: int) -> int:
    return amount


@task(takes_context=True, queue_name="tasks", retry=RetryPolicy(attempts=2, base_delay=0))
def nap(context: TaskContext, seconds: float) -> int:
    """Records the attempt, then sleeps: the process tests kill or cancel it mid-way."""
    Execution.objects.create(
        run_id=run_id_of(context.task_result.id),
        job_type="nap",
        attempt=context.attempt,
        pid=os.getpid(),
    )
    time.sleep(seconds)
    return context.attempt


# How many runs of together_async this process runs at this moment, and the most seen.
together = {"now": 0, "most": 0}


@task(queue_name="tasks")
async def together_async(n: int) -> int:
    """Wait (up to 20 s) until ``n`` runs of this task run at once in this process;
    return the most seen. On a worker's event loop they overlap with one thread."""
    together["now"] += 1
    together["most"] = max(together["most"], together["now"])
    try:
        deadline = time.monotonic() + 20
        while together["most"] < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return together["most"]
    finally:
        together["now"] -= 1


@task(takes_context=True, queue_name="tasks", retry=RetryPolicy(attempts=2, base_delay=0))
async def nap_async(context: TaskContext, seconds: float) -> int:
    """``nap`` as an async task: records the attempt through the async ORM, then sleeps."""
    await Execution.objects.acreate(
        run_id=run_id_of(context.task_result.id),
        job_type="nap",
        attempt=context.attempt,
        pid=os.getpid(),
    )
    await asyncio.sleep(seconds)
    return context.attempt


@task
def note(name: str) -> str:
    """Leaves a row named ``name``: a side effect any backend's test can look for."""
    Execution.objects.create(run_id=0, job_type=name, attempt=1, pid=os.getpid())
    return name


@task
def overlapping(seconds: float) -> int:
    """Records when it ran (started_at, finished_at), to find runs that overlapped."""
    row = Execution.objects.create(run_id=0, job_type="overlapping", attempt=1, pid=os.getpid())
    time.sleep(seconds)
    Execution.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return row.pk
