"""Retention in a real ``runjobworker``: old finished runs go while it runs, nothing a
waiting parent or a waiting caller needs goes with them, and ``RETENTION = None``
keeps everything."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_jobs import send_event, start
from django_jobs.models import JobEvent, JobRun, JobStep, Status
from tests.helpers import WorkerProcess, wait_until
from tests.process.faults import StartWorker, assert_alive_and_stop_cleanly

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

# The workers prune every 0.1 to 0.3 s (tests/testapp/jobs.py), not every few minutes.
FAST = {"DJANGO_JOBS_RETENTION_INTERVAL": "0.2"}


def started(worker: WorkerProcess, retention: str) -> None:
    wait_until(lambda: " started pools=" in worker.output(), timeout=60)
    line = next(line for line in worker.output().splitlines() if " started pools=" in line)
    assert line.endswith(f" retention={retention}"), line


def finish(*runs: JobRun) -> None:
    ids = [run.pk for run in runs]
    wait_until(
        lambda: JobRun.objects.filter(pk__in=ids, status=Status.COMPLETED).count() == len(ids),
        timeout=60,
    )


def age(runs: Iterable[JobRun], days: int = 40) -> None:
    """Make finished runs look as if they had finished ``days`` ago."""
    ids = [run.pk for run in runs]
    aged = JobRun.objects.filter(pk__in=ids).update(
        finished_at=timezone.now() - timedelta(days=days)
    )
    assert aged == len(ids)


def gone(runs: Iterable[JobRun]) -> bool:
    return not JobRun.objects.filter(pk__in=[run.pk for run in runs]).exists()


def test_old_runs_go_while_the_worker_runs_and_a_waiting_familys_stay(
    start_worker: StartWorker,
) -> None:
    worker = start_worker("--pool", "default", **FAST)
    started(worker, "30d")
    old = [start("tests.three_steps") for _ in range(3)]
    recent = start("tests.record")
    finish(*old, recent)
    # A parent waiting for two children; one of them has finished.
    parent = start("tests.parent", {"n": 2, "child": "tests.approval"})
    wait_until(
        lambda: JobRun.objects.filter(parent=parent, status=Status.WAITING).count() == 2,
        timeout=60,
    )
    done, still = JobRun.objects.filter(parent=parent).order_by("pk")
    send_event(done, "approved", "yes")
    finish(done)
    # A caller waits for the parent meanwhile.
    outcome: list[Any] = []

    def wait_for_parent() -> None:
        try:
            outcome.append(parent.wait(timeout=120))
        except BaseException as exc:  # the test fails below, naming it
            outcome.append(exc)
        finally:
            connection.close()

    waiter = threading.Thread(target=wait_for_parent)
    waiter.start()
    # The last old run comes after the parent's family by id: once it is gone, the
    # walk has passed that family.
    last = start("tests.record")
    finish(last)
    age([*old, done, last])
    wait_until(lambda: gone([*old, last]), timeout=60)
    assert not JobStep.objects.filter(run_id__in=[run.pk for run in old]).exists()
    family = JobRun.objects.filter(pk__in=[parent.pk, done.pk, still.pk])
    assert dict(family.values_list("pk", "status")) == {
        parent.pk: Status.WAITING,
        done.pk: Status.COMPLETED,
        still.pk: Status.WAITING,
    }
    assert JobRun.objects.filter(pk=recent.pk).exists()
    # The parent wakes, reads its children's outputs, and the caller gets its own.
    send_event(still, "approved", "also")
    waiter.join(timeout=120)
    assert not waiter.is_alive()
    assert outcome == [{"children": [done.pk, still.pk], "outputs": [["yes"], ["also"]]}]
    # Once the whole family has finished long enough ago, it goes whole.
    age([parent])
    wait_until(lambda: gone([parent, done, still]), timeout=60)
    ids = [parent.pk, done.pk, still.pk]
    assert not JobStep.objects.filter(run_id__in=ids).exists()
    assert not JobEvent.objects.filter(run_id__in=ids).exists()
    wait_until(lambda: "retention deleted runs=" in worker.output())
    assert_alive_and_stop_cleanly([worker])


def test_retention_none_keeps_every_run(start_worker: StartWorker) -> None:
    keeper = start_worker("--pool", "default", DJANGO_JOBS_RETENTION="off", **FAST)
    started(keeper, "off")
    old = [start("tests.three_steps") for _ in range(3)]
    finish(*old)
    age(old)
    # A run started after the ageing, finished: the worker has been at work since.
    later = start("tests.record")
    finish(later)
    # Long enough for dozens of passes, were the worker pruning.
    time.sleep(3)
    assert JobRun.objects.filter(pk__in=[run.pk for run in old]).count() == len(old)
    assert "retention deleted" not in keeper.output()
    assert_alive_and_stop_cleanly([keeper])
    # The same runs go with a worker that prunes: they were old enough.
    pruning = start_worker("--pool", "default", **FAST)
    started(pruning, "30d")
    wait_until(lambda: gone(old), timeout=60)
    assert_alive_and_stop_cleanly([pruning])
