"""Durable execution across real worker processes: kills, cancel, timeouts, keys."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable

import pytest

from django_jobs import cancel, start, start_many
from django_jobs.models import JobRun, Status
from tests.helpers import WorkerProcess, wait_until
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def status_of(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def effects(run: JobRun, name: str) -> int:
    return Execution.objects.filter(run_id=run.pk, job_type=f"effect:{name}").count()


def test_killed_in_its_third_step_resumes_elsewhere_without_redoing_steps(
    start_worker: StartWorker,
) -> None:
    run = start("tests.three_steps", {"sleep_in_c": 30})
    victim = start_worker("--pool", "default")
    wait_until(lambda: effects(run, "c-started") == 1)
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # c's sleep is long enough for the kill to land on a loaded machine, and short
    # the next time.
    JobRun.objects.filter(pk=run.pk).update(input={"sleep_in_c": 0})
    start_worker("--pool", "default")
    wait_until(lambda: status_of(run) == Status.COMPLETED, timeout=40)
    run.refresh_from_db()
    assert run.attempts == 2
    assert (effects(run, "a"), effects(run, "b")) == (1, 1)
    assert (effects(run, "c-started"), effects(run, "c")) == (2, 1)


def test_a_waiting_parent_frees_the_only_slot_for_its_children(start_worker: StartWorker) -> None:
    parent = start("tests.parent", {"n": 3, "child": "tests.record"})
    worker = start_worker("--pool", "default", "--concurrency", "1", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED
    assert parent.output["outputs"] == [{"attempt": 1}] * 3


def test_cooperative_cancel_of_a_running_run(start_worker: StartWorker) -> None:
    run = start("tests.cooperative", {"seconds": 30})
    start_worker("--pool", "default")
    wait_until(lambda: effects(run, "cooperative") == 1)
    assert cancel(run.pk, reason="operator") == 1
    # The worker notices within a heartbeat (1 s here) and the handler stops.
    wait_until(lambda: status_of(run) == Status.CANCELED, timeout=15)
    run.refresh_from_db()
    assert run.cancel_reason == "operator"
    assert run.error["type"] == "django_jobs.exceptions.JobCanceled"


def test_a_handler_ignoring_cancel_is_fenced_after_the_grace(start_worker: StartWorker) -> None:
    run = start("tests.ignoring", {"seconds": 6})
    # -v 2: the handler's late return is a DEBUG line (its run's end was logged).
    worker = start_worker("--pool", "default", "-v", "2", DJANGO_JOBS_CANCEL_GRACE="1")
    wait_until(lambda: effects(run, "ignoring") == 1)
    cancel(run.pk)
    wait_until(lambda: status_of(run) == Status.CANCELED, timeout=15)
    # The handler returns later; its result is discarded.
    wait_until(lambda: "outcome=lost" in worker.output(), timeout=20)
    run.refresh_from_db()
    assert (run.status, run.output) == (Status.CANCELED, None)
    assert "ignored the cancel request" in run.error["message"]


def test_a_run_past_its_timeout_ends_timed_out_and_its_late_result_is_dropped(
    start_worker: StartWorker,
) -> None:
    run = start("tests.slow", {"seconds": 3})
    worker = start_worker("--pool", "default", "-v", "2")  # the late return is a DEBUG line
    wait_until(lambda: status_of(run) == Status.TIMED_OUT, timeout=15)
    run.refresh_from_db()
    assert run.cancel_requested_at is not None
    assert run.error["type"] == "django_jobs.exceptions.JobTimeout"
    wait_until(lambda: "outcome=lost" in worker.output(), timeout=20)
    assert status_of(run) == Status.TIMED_OUT
    assert JobRun.objects.get(pk=run.pk).output is None


def test_a_durable_sleep_resumes_on_the_worker(start_worker: StartWorker) -> None:
    run = start("tests.sleeper", {"seconds": 3})
    start_worker("--pool", "default")
    wait_until(lambda: status_of(run) == Status.WAITING)
    wait_until(lambda: status_of(run) == Status.COMPLETED, timeout=20)
    assert (effects(run, "before"), effects(run, "after")) == (1, 1)


def test_one_concurrency_key_never_overlaps_across_workers(start_worker: StartWorker) -> None:
    runs = start_many("tests.keyed", [{"key": "account:1", "seconds": 0.02} for _ in range(50)])
    workers = [start_worker("--pool", "default", "--concurrency", "4", "--burst") for _ in range(3)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0, worker.output()
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == len(runs)
    intervals = sorted(
        Execution.objects.filter(job_type="keyed").values_list("started_at", "finished_at")
    )
    assert len(intervals) == 50
    for (_, end), (next_start, _) in itertools.pairwise(intervals):
        assert end <= next_start
