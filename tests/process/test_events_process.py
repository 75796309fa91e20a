"""Events into runs across real worker processes: many senders at once, sync and
async handlers, and exactly one wait per event through kill -9 and rescue."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import close_old_connections, connection

from django_jobs import send_event, start
from django_jobs.models import JobEvent, JobRun, JobStep, Status
from tests.helpers import wait_until
from tests.process.faults import StartWorker, assert_alive_and_stop_cleanly
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

RUNS = 40
SENDERS = 3


def test_many_senders_at_once_each_event_taken_by_one_wait(start_worker: StartWorker) -> None:
    runs = [
        start("tests.approval" if n % 2 else "tests.async_approval", {"count": SENDERS})
        for n in range(RUNS)
    ]
    workers = [start_worker("--pool", "default", "--concurrency", "4") for _ in range(2)]
    # Some runs wait before their events come, others get them first.
    wait_until(lambda: JobRun.objects.filter(status=Status.WAITING).count() >= RUNS // 4)
    errors: list[BaseException] = []

    def send(sender: int) -> None:
        try:
            for run in runs:
                send_event(run, "approved", {"sender": sender, "run": run.pk})
        except BaseException as exc:  # the test fails below, naming it
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    close_old_connections()
    assert errors == []
    wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == RUNS, timeout=120)
    assert not JobEvent.objects.filter(consumed_at__isnull=True).exists()
    for run in JobRun.objects.all():
        assert sorted(taken["sender"] for taken in run.output) == list(range(SENDERS))
        assert {taken["run"] for taken in run.output} == {run.pk}
        consumers = JobEvent.objects.filter(run=run).values_list("consumed_by", flat=True)
        assert sorted(consumers) == ["event:approved", "event:approved#2", "event:approved#3"]
    assert_alive_and_stop_cleanly(workers)


def test_an_event_taken_before_a_kill_is_not_taken_again(start_worker: StartWorker) -> None:
    run = start("tests.approval", {"count": 1, "sleep_after": 30})
    victim = start_worker("--pool", "default")
    wait_until(lambda: JobRun.objects.filter(pk=run.pk, status=Status.WAITING).exists())
    send_event(run, "approved", "first")
    send_event(run, "approved", "second")
    # The wait took "first" and recorded it; the handler is busy after it.
    wait_until(lambda: Execution.objects.filter(run_id=run.pk).count() == 1)
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    JobRun.objects.filter(pk=run.pk).update(input={"count": 1})  # no sleep this time
    rescuer = start_worker("--pool", "default")
    wait_until(
        lambda: JobRun.objects.filter(pk=run.pk, status=Status.COMPLETED).exists(), timeout=60
    )
    done = JobRun.objects.get(pk=run.pk)
    assert (done.attempts, done.output) == (2, ["first"])
    assert JobEvent.objects.get(consumed_at__isnull=True).payload == "second"
    assert JobStep.objects.filter(run=run, step_id__startswith="event:").count() == 1
    assert_alive_and_stop_cleanly([rescuer])


def test_a_wait_with_a_timeout_resumes_on_a_worker_at_its_deadline(
    start_worker: StartWorker,
) -> None:
    run = start("tests.approval", {"timeout": 1.5, "default": "nobody answered"})
    worker = start_worker("--pool", "default")
    began = time.monotonic()
    wait_until(
        lambda: JobRun.objects.filter(pk=run.pk, status=Status.COMPLETED).exists(), timeout=30
    )
    assert time.monotonic() - began >= 1.4
    assert JobRun.objects.get(pk=run.pk).output == ["nobody answered"]
    assert_alive_and_stop_cleanly([worker])


def test_a_run_that_took_an_event_without_waiting_is_still_timed_out(
    start_worker: StartWorker,
) -> None:
    run = start("tests.event_then_hang", {"seconds": 8})
    send_event(run, "go")
    worker = start_worker("--pool", "default")
    wait_until(
        lambda: JobRun.objects.filter(pk=run.pk, status=Status.TIMED_OUT).exists(), timeout=30
    )
    # Its 1 s timeout, not the handler's 8 s sleep (timed by the run's own row: a
    # loaded machine may take seconds to start the worker).
    ended = JobRun.objects.get(pk=run.pk)
    assert (ended.finished_at - ended.started_at).total_seconds() < 7
    assert Execution.objects.filter(run_id=run.pk).count() == 1
    assert_alive_and_stop_cleanly([worker])
