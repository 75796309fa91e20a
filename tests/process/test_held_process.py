"""Runs held for their concurrency key, across real worker processes and kill -9.

Runs of a few keys arrive in waves while the keys are taken (so they start held)
and while workers are killed at random: every run completes once its attempt
finished, no two runs of a key ever overlap, and none is left held.
"""

from __future__ import annotations

import itertools
import random
import signal
import time

import pytest

from django_jobs import start_many
from django_jobs.models import Hold, JobRun, Status
from tests.process.faults import StartWorker
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

KEYS = 4
WAVES = 6
PER_WAVE = 40  # runs per wave, over the keys
WORKERS = 3
CONCURRENCY = 4


def test_held_runs_of_busy_keys_run_once_each_in_turn_through_a_kill_storm(
    start_worker: StartWorker,
) -> None:
    args = ("--pool", "default", "--concurrency", str(CONCURRENCY))
    fleet = [start_worker(*args) for _ in range(WORKERS)]
    rng = random.Random(29)
    held_seen = kills = 0
    for wave in range(WAVES):
        start_many(
            "tests.keyed_retried",
            [{"key": f"k{n % KEYS}", "seconds": 0.05} for n in range(PER_WAVE)],
        )
        held_seen = max(held_seen, JobRun.objects.filter(hold=Hold.KEY).count())
        time.sleep(rng.uniform(0.5, 1.0))
        if wave % 2:
            victim = fleet.pop(rng.randrange(len(fleet)))
            victim.signal(signal.SIGKILL)
            victim.wait(timeout=10)
            kills += 1
            fleet.append(start_worker(*args))
    total = WAVES * PER_WAVE
    deadline = time.monotonic() + 180
    while JobRun.objects.filter(status=Status.COMPLETED).count() < total:
        assert time.monotonic() < deadline, list(
            JobRun.objects.exclude(status=Status.COMPLETED).values_list("id", "status", "hold")
        )
        time.sleep(0.5)
    assert held_seen > 0, "no run was ever held: the test proved nothing"
    assert not JobRun.objects.filter(status=Status.PENDING).exists()
    assert not JobRun.objects.exclude(hold=Hold.READY).exists()
    # Each run's finished execution is its only one past the kills, and two runs
    # of one key never ran at once (an execution cut by a kill has no end).
    for key in range(KEYS):
        spans = sorted(
            Execution.objects.filter(
                job_type=f"keyed:k{key}", finished_at__isnull=False
            ).values_list("started_at", "finished_at")
        )
        for (_, end), (next_start, _) in itertools.pairwise(spans):
            assert end <= next_start, key
    finished = Execution.objects.filter(job_type__startswith="keyed:", finished_at__isnull=False)
    assert finished.values("run_id").distinct().count() == total
    print(f"\nheld: {total} runs over {KEYS} keys, {kills} kills, {held_seen} held at once at most")
