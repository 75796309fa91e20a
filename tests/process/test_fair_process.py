"""Fair turns across real worker processes: runs another tenant starts while one
tenant's burst drains are claimed within a claim or two of their start, and
every run of both completes once."""

from __future__ import annotations

import time

import pytest
from django.db.models import Q

from django_jobs import start, start_many
from django_jobs.models import JobRun, Status
from tests.process.faults import StartWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

BURST = 3000
LATE = 10


def test_another_tenants_runs_wait_a_claim_or_two_while_a_burst_drains(
    start_worker: StartWorker,
) -> None:
    burst = start_many("tests.sleep", [{"seconds": 0.01}] * BURST, tenant_id="big")
    workers = [start_worker("--pool", "default", "--concurrency", "4") for _ in range(2)]
    late = []
    deadline = time.monotonic() + 120
    while len(late) < LATE:
        assert time.monotonic() < deadline, "the burst did not start draining"
        if JobRun.objects.filter(tenant_id="big", status=Status.COMPLETED).count() >= 100:
            late.append(start("tests.sleep", {"seconds": 0.01}, tenant_id=f"small{len(late)}"))
            time.sleep(0.3)
        else:
            time.sleep(0.05)
    while JobRun.objects.exclude(status=Status.COMPLETED).exists():
        assert time.monotonic() < deadline, "the runs did not drain"
        for worker in workers:
            assert worker.proc.poll() is None, worker.output()
        time.sleep(0.2)
    assert JobRun.objects.filter(status=Status.COMPLETED, attempts=1).count() == BURST + LATE
    pending_big = 0
    for run in JobRun.objects.filter(pk__in=[r.pk for r in late]):
        # Claims of the burst between this run's start and its claim: a claim
        # gives the runs it takes one started_at.
        between = JobRun.objects.filter(
            Q(tenant_id="big"), started_at__gt=run.created_at, started_at__lt=run.started_at
        )
        claims = between.values("started_at").distinct().count()
        assert claims <= 2, (run.pk, claims)
        pending_big = max(
            pending_big,
            JobRun.objects.filter(tenant_id="big", started_at__gt=run.created_at).count(),
        )
    # The burst was still draining when the other tenants started their runs, or
    # the test proved nothing.
    assert pending_big > 100
    assert burst[0].pk < late[0].pk
