"""Runs held for their concurrency key, across real worker processes and kill -9.

Runs of a few keys arrive in waves while the keys are taken (so they start held)
and while workers are killed at random: every run completes once its attempt
finished, no more runs of a key than its limit (1, or 3) ever overlap, and none
is left held.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import time

import pytest
from django.conf import settings
from django.db.models import Count
from django.test import override_settings

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


@pytest.mark.parametrize(
    ("job_type", "limit"),
    [("tests.keyed_retried", 1), ("tests.limited_retried", 3), ("tests.tenanted_retried", 2)],
)
def test_held_runs_of_busy_keys_run_once_each_in_turn_through_a_kill_storm(
    start_worker: StartWorker, job_type: str, limit: int
) -> None:
    """Runs of a key of limit 1 and 3, and of tenants capped at 2 (grouped by tenant,
    with no key)."""
    tenanted = job_type == "tests.tenanted_retried"
    env = {"DJANGO_JOBS_TENANT_CONCURRENCY": json.dumps(limit)} if tenanted else {}
    with override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "TENANT_CONCURRENCY": limit}):
        _storm(start_worker, env, job_type, limit, tenanted)


def _storm(
    start_worker: StartWorker, env: dict[str, str], job_type: str, limit: int, tenanted: bool
) -> None:
    args = ("--pool", "default", "--concurrency", str(CONCURRENCY))
    fleet = [start_worker(*args, **env) for _ in range(WORKERS)]
    rng = random.Random(29)
    held_seen = kills = running_seen = 0
    for wave in range(WAVES):
        for key in range(KEYS):
            runs = [{"key": f"k{key}", "seconds": 0.05}] * (PER_WAVE // KEYS)
            start_many(job_type, runs, tenant_id=f"k{key}" if tenanted else None)
        held_seen = max(held_seen, JobRun.objects.exclude(hold=Hold.READY).count())
        pause = time.monotonic() + rng.uniform(0.5, 1.0)
        while time.monotonic() < pause:
            running_seen = max(running_seen, _most_running(tenanted))
            held_seen = max(held_seen, JobRun.objects.exclude(hold=Hold.READY).count())
            time.sleep(0.02)
        if wave % 2:
            victim = fleet.pop(rng.randrange(len(fleet)))
            victim.signal(signal.SIGKILL)
            victim.wait(timeout=10)
            kills += 1
            fleet.append(start_worker(*args, **env))
    total = WAVES * PER_WAVE
    deadline = time.monotonic() + 180
    while JobRun.objects.filter(status=Status.COMPLETED).count() < total:
        running_seen = max(running_seen, _most_running(tenanted))
        # Held runs are looked for until the end: on a loaded machine the workers
        # may reach the last waves' runs only after the waves were started.
        held_seen = max(held_seen, JobRun.objects.exclude(hold=Hold.READY).count())
        assert time.monotonic() < deadline, list(
            JobRun.objects.exclude(status=Status.COMPLETED).values_list("id", "status", "hold")
        )
        time.sleep(0.5)
    assert held_seen > 0, "no run was ever held: the test proved nothing"
    assert not JobRun.objects.filter(status=Status.PENDING).exists()
    assert not JobRun.objects.exclude(hold=Hold.READY).exists()
    # The database never had more runs of a key running than its limit.
    assert running_seen <= limit
    # Each run's finished execution is its only one past the kills, and no more
    # runs of one key than its limit ran at once (an execution cut by a kill has
    # no end).
    overlap = 0
    for key in range(KEYS):
        spans = Execution.objects.filter(
            job_type=f"keyed:k{key}", finished_at__isnull=False
        ).values_list("started_at", "finished_at")
        # Ends before starts at one instant: a run that ended as the next began.
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        overlap = max(overlap, max(itertools.accumulate(step for _, step in edges)))
    assert 1 <= overlap <= limit
    # The limit was reached, seen in the rows or in the spans (the rows are sampled;
    # or the test proved nothing).
    assert max(running_seen, overlap) == limit, (running_seen, overlap)
    finished = Execution.objects.filter(job_type__startswith="keyed:", finished_at__isnull=False)
    assert finished.values("run_id").distinct().count() == total
    print(
        f"\nheld: {total} runs over {KEYS} keys of limit {limit}, {kills} kills, "
        f"{held_seen} held at once at most, {running_seen} of a key running at once at most"
    )


def _most_running(tenanted: bool) -> int:
    """The most runs of one concurrency key (or tenant) running now."""
    group = "tenant_id" if tenanted else "concurrency_key"
    counts = (
        JobRun.objects.filter(status=Status.RUNNING, **{f"{group}__isnull": False})
        .order_by()
        .values(group)
        .annotate(n=Count("id"))
        .values_list("n", flat=True)
    )
    return max(counts, default=0)
