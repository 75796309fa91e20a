"""Mixed load across four worker processes: priorities, concurrency keys, children.

The test command runs a short form; the full 100,000 runs by hand:

    LOAD_RUNS=100000 .venv/bin/python -m pytest tests/process/test_load.py -s
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import pytest

from django_jobs import start_many
from django_jobs.models import JobRun, Status
from tests.helpers import WorkerProcess, lock_waiters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]
RUNS = int(os.environ.get("LOAD_RUNS", "3000"))
WORKERS = 4
STALL = 10.0  # seconds without any run moving on that count as a stalled fleet


def test_mixed_load_completes_without_deadlocks_or_stalls(start_worker: StartWorker) -> None:
    rng = random.Random(os.environ.get("LOAD_SEED"))
    parents = RUNS // 20
    keyed = RUNS // 10
    plain = RUNS - parents - keyed
    for priority in range(-5, 6):
        start_many("tests.noop", [{} for _ in range(plain // 11)], priority=priority)
    plain = (plain // 11) * 11
    start_many(
        "tests.keyed", [{"key": f"k{rng.randrange(20)}", "seconds": 0} for _ in range(keyed)]
    )
    start_many("tests.parent", [{"n": 2, "child": "tests.noop"} for _ in range(parents)])
    total = plain + keyed + parents * 3  # each parent adds two children
    started = time.monotonic()
    workers = [
        start_worker("--pool", "default", "--concurrency", "8", "-v", "0") for _ in range(WORKERS)
    ]
    done, progress, last_progress, most_waiters = 0, (0, 0, 0), time.monotonic(), 0
    while done < total:
        time.sleep(0.5)
        done = JobRun.objects.filter(status=Status.COMPLETED).count()
        # Parents waiting on children and children spawned count as progress too.
        now = (done, JobRun.objects.filter(status=Status.WAITING).count(), JobRun.objects.count())
        most_waiters = max(most_waiters, lock_waiters())
        if now != progress:
            progress, last_progress = now, time.monotonic()
        assert time.monotonic() - last_progress < STALL, f"stalled at {progress}, {total} runs"
        assert not JobRun.objects.filter(status=Status.FAILED).exists()
    elapsed = time.monotonic() - started
    assert JobRun.objects.count() == total
    for worker in workers:
        assert worker.proc.poll() is None
        worker.signal(15)
        assert worker.wait(timeout=60) == 0
        assert "deadlock" not in worker.output().lower()
    print(
        f"\nload: {total} runs ({plain} plain over 11 priorities, {keyed} keyed over 20 keys, "
        f"{parents} parents with {2 * parents} children), {WORKERS} workers x 8 threads, "
        f"{elapsed:.1f} s, {total / elapsed:,.0f} runs/s, most lock waiters seen {most_waiters}"
    )
