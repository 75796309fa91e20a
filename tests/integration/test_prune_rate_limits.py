"""Retention of rate-limit rows (issue 32 §8): the rows of idle limits go, busy ones stay.

A keyed limit makes one row per key its callers choose; without retention the
table only grows. A row goes once it holds nothing: no start within its window
(under the longer of its own rate and the one in force), not held, and no
pending or running run under it. Deleting such a row changes nothing a claim
decides, so a prune may race the claims that make and use the rows.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from django_jobs.models import JobRateLimit, JobRun, Status
from django_jobs.ratelimits import Limits, Rate
from django_jobs.storage import claiming, rateholds
from django_jobs.storage import ratelimits as limited
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def row(scope: str, name: str, *, ago: float, rate: Rate, **fields: Any) -> JobRateLimit:
    """A limit row as a claim leaves it, its last start ``ago`` seconds back."""
    now = timezone.now()
    instant = now - timedelta(seconds=ago)
    limit: JobRateLimit = JobRateLimit.objects.create(
        scope=scope,
        name=name,
        limit=rate.count,
        period=rate.seconds,
        starts=[[instant.timestamp(), 1]],
        **fields,
    )
    JobRateLimit.objects.filter(pk=limit.pk).update(updated_at=instant)
    return limit


def prunejobs(*args: str) -> str:
    out = StringIO()
    call_command("prunejobs", *args, stdout=out)
    return out.getvalue()


def names() -> set[str]:
    return set(JobRateLimit.objects.values_list("name", flat=True))


@pytest.fixture
def rows() -> set[str]:
    """2,000 idle keys and the rows that must stay; returns the names that stay.

    The limits in force are the test app's: ``tests.limited`` 20/s,
    ``tests.limited_per_key`` 2/h per key.
    """
    hourly = Rate(2, 3600.0)
    JobRateLimit.objects.bulk_create(
        JobRateLimit(
            scope="key",
            name=f"customer:{n}",
            limit=2,
            period=3600.0,
            starts=[[time.time() - 7200, 2]],
        )
        for n in range(2000)
    )
    JobRateLimit.objects.update(updated_at=timezone.now() - timedelta(hours=2))
    row("job", "tests.limited_async", ago=10, rate=Rate(20, 1.0))  # idle: 1 s window
    row("pool", "gone", ago=120, rate=Rate(5, 60.0))  # no longer declared, idle
    kept = {
        row("key", "busy", ago=600, rate=hourly).name,  # a start 10 minutes back
        row(
            "job",
            "tests.limited",
            ago=0,
            rate=Rate(20, 1.0),
            open_at=timezone.now() + timedelta(hours=1),
        ).name,
        # Idle under the rate it was stored with (1/m), not under the one in force (2/h).
        row("key", "lengthened", ago=600, rate=Rate(1, 60.0)).name,
        # Of a limit no code declares now: judged by its own rate, a day.
        row("pool", "daily", ago=3600, rate=Rate(5, 86_400.0)).name,
        # Idle windows, but runs are under them: kept for them.
        row("key", "waiting", ago=7200, rate=hourly).name,
        row("pool", "ratelimited", ago=120, rate=Rate(5, 60.0)).name,
    }
    JobRunFactory(job_type="tests.limited_per_key", rate_key="waiting", pool="ratelimited")
    RunningJobRunFactory(job_type="tests.noop", pool="ratelimited")
    return kept


def test_prunejobs_deletes_the_rows_of_idle_limits_and_keeps_the_busy_ones(rows: set[str]) -> None:
    assert JobRateLimit.objects.count() == 2008
    out = prunejobs()
    assert "Deleted 2002 rate-limit rows that held nothing" in out
    assert names() == rows
    assert "Deleted 0 rate-limit rows" in prunejobs()


def test_a_dry_run_counts_the_idle_rows_and_deletes_none(rows: set[str]) -> None:
    assert "Would delete 2002 rate-limit rows" in prunejobs("--dry-run")
    assert JobRateLimit.objects.count() == 2008


def test_idle_rows_go_in_batches(rows: set[str]) -> None:
    assert "Deleted 2002 rate-limit rows" in prunejobs("--batch-size", "150")
    assert names() == rows


def test_a_row_whose_starts_cannot_be_decoded_is_judged_by_its_last_use() -> None:
    limit = row("key", "hostile", ago=7200, rate=Rate(2, 3600.0))
    from django.db import connection

    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_jobs_jobratelimit SET starts = %s{cast} WHERE id = %s",
            ["[[1" + "0" * 5000 + ", 1]]", limit.pk],
        )
    assert "Deleted 1 rate-limit rows" in prunejobs()


@pytest.mark.parametrize("round", range(3))
def test_a_prune_racing_claims_never_lets_a_key_start_twice_in_its_window(round: int) -> None:
    """30 keys under 2 starts per 0.3 s get runs in threes, 0.05 s apart, a three every
    1.6 s, while 3 claimers admit them and a pruner deletes the rows of keys with
    no run waiting and an empty window. After the first of three starts, no run of
    its key waits, and its window, not full (not held), holds that start: a prune
    that deleted that row would let all three start within 0.3 s. Between the
    threes, rows go and claims make them again. No key may start three times
    within 0.3 s (measured on started_at)."""
    rate = Rate(2, 0.3)
    limits = Limits({"tests.limited_per_key": rate}, frozenset({"tests.limited_per_key"}))
    keys, threes = 30, 5
    workers = [WorkerFactory().pk for _ in range(3)]
    fed = threading.Event()
    done = threading.Event()
    pruned: list[int] = []

    def feed() -> None:
        try:
            for _ in range(threes):
                # The last pause leaves each key idle (window empty, no run
                # waiting) for a while, however slowly the claims admit its third
                # run: long enough for the pruner to find rows to delete.
                for pause in (0.05, 0.05, 1.5):
                    JobRun.objects.bulk_create(
                        JobRun(job_type="tests.limited_per_key", rate_key=f"k{key}")
                        for key in range(keys)
                    )
                    time.sleep(pause)
        finally:
            fed.set()
            connections.close_all()

    def claim(worker_id: Any) -> int:
        claimed = 0
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                # As a worker's pass does: the runs held while their window was
                # full are released as it opens.
                rateholds.release_open(limits, 0.01)
                batch = claiming.claim_batch(worker_id, None, 4, limits=limits)
                # Finish them at once, so that only the window holds a key back.
                JobRun.objects.filter(pk__in=[c.run_id for c in batch]).update(
                    status=Status.COMPLETED, lease_token=None, finished_at=timezone.now()
                )
                claimed += len(batch)
                if fed.is_set() and not JobRun.objects.filter(status=Status.PENDING).exists():
                    break
                if not batch:
                    time.sleep(0.01)
            return claimed
        finally:
            connections.close_all()

    def prune() -> None:
        try:
            while not done.is_set():
                pruned.append(limited.prune_idle(limits, batch_size=7))
        finally:
            connections.close_all()

    with ThreadPoolExecutor(5) as pool:
        feeder = pool.submit(feed)
        pruner = pool.submit(prune)
        try:
            claimed = sum(pool.map(claim, workers))
        finally:
            done.set()  # a claimer that failed must not leave the pruner running
        feeder.result()
        pruner.result()
    assert claimed == keys * threes * 3
    assert sum(pruned) >= keys  # the race was run: rows went while claims made them again
    starts: dict[str, list[float]] = {}
    for key, started in JobRun.objects.values_list("rate_key", "started_at"):
        starts.setdefault(key, []).append(started.timestamp())
    closest = min(
        later[2] - later[0]
        for instants in starts.values()
        for later in zip(*(sorted(instants)[n:] for n in range(3)), strict=False)
    )
    assert closest >= rate.seconds - 1e-3
