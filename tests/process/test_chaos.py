"""Kill storms: workers SIGKILLed at random while they run durable steps.

The short form runs in the test command. The long form, by hand:

    CHAOS_SECONDS=300 CHAOS_RUNS=3000 .venv/bin/python -m pytest tests/process/test_chaos.py -s
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from django_jobs import start_many
from django_jobs.models import JobRun, Status
from tests.process.faults import StartWorker, assert_every_run_completed_once
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


SECONDS = float(os.environ.get("CHAOS_SECONDS", "8"))
RUNS = int(os.environ.get("CHAOS_RUNS", "120"))
PAUSE = 0.25  # seconds each step takes: runs are in flight all through the storm
WORKERS = 3
CONCURRENCY = 4


def test_a_kill_storm_loses_nothing_and_repeats_no_recorded_step(
    start_worker: StartWorker,
) -> None:
    start_many("tests.chaos", [{"pause": PAUSE} for _ in range(RUNS)])
    args = ("--pool", "default", "--concurrency", str(CONCURRENCY))
    fleet = [start_worker(*args) for _ in range(WORKERS)]
    rng = random.Random(os.environ.get("CHAOS_SEED"))
    kills = hits = 0
    storm_ends = time.monotonic() + SECONDS
    # The storm goes on (up to 60 s more) until some kill hit a worker running runs:
    # on a loaded machine, workers that are still starting may be all it found.
    while time.monotonic() < storm_ends or (not hits and time.monotonic() < storm_ends + 60):
        time.sleep(rng.uniform(1.0, 2.0))
        busy = set(
            JobRun.objects.filter(status=Status.RUNNING).values_list("claimed_by__pid", flat=True)
        )
        running = [n for n, worker in enumerate(fleet) if worker.pid in busy]
        victim = fleet.pop(rng.choice(running or range(len(fleet))))
        hits += victim.pid in busy
        victim.signal(signal.SIGKILL)
        victim.wait(timeout=10)
        kills += 1
        fleet.append(start_worker(*args))
    # Let the fleet drain: the killed workers' runs are rescued once their
    # heartbeats are stale, and run again.
    deadline = time.monotonic() + 120 + RUNS / 10
    while JobRun.objects.filter(status=Status.COMPLETED).count() < RUNS:
        assert time.monotonic() < deadline, list(
            JobRun.objects.exclude(status=Status.COMPLETED).values_list("id", "status")
        )
        time.sleep(0.5)

    assert_every_run_completed_once(RUNS)
    # A kill interrupts at most the steps in flight on that worker.
    executions = Execution.objects.filter(job_type__startswith="effect:").count()
    repeated = executions - 3 * RUNS
    assert 0 <= repeated <= kills * CONCURRENCY, (repeated, kills)
    rescued = JobRun.objects.filter(attempts__gt=1).count()
    assert rescued > 0, "no kill hit a running run: the storm proved nothing"
    print(f"\nchaos: {RUNS} runs, {kills} kills, {rescued} rescued, {repeated} steps run again")
