"""``async def`` handlers on real workers' event loops: every durable rule of DESIGN.md.

The async twins of tests/process/test_durable_process.py's handlers (tests/testapp/jobs.py)
run as tasks on ``runjobworker``'s loop: steps replayed after a retry and after a
SIGKILL, children awaited, durable sleeps and waits freeing the slot, concurrency
keys across workers, cancellation (pending, running, cascade, ignored), timeouts
that stop the task, rescue, SIGTERM drain, and the connections many runs share.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from django.db import connections

from django_jobs import cancel, start, start_many
from django_jobs.eventloop import DATABASE_THREADS
from django_jobs.models import JobRun, JobStep, Status, Worker, WorkerStatus
from tests.helpers import WorkerProcess, status_of, terminate_other_connections, wait_until
from tests.process.faults import assert_alive_and_stop_cleanly, assert_every_run_completed_once
from tests.process.test_connections import session_ids, sessions
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def effects(run: JobRun, name: str) -> int:
    return Execution.objects.filter(run_id=run.pk, job_type=f"effect:{name}").count()


def refreshed(run: JobRun) -> JobRun:
    run.refresh_from_db()
    return run


def test_killed_in_its_third_step_resumes_elsewhere_without_redoing_steps(
    start_worker: StartWorker,
) -> None:
    run = start("tests.async_three_steps", {"sleep_in_c": 30})
    victim = start_worker("--pool", "default")
    wait_until(lambda: effects(run, "c-started") == 1)
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # The next worker rescues the run once the victim's heartbeat is stale (3 s
    # here), and replays a and b; c's sleep is short this time.
    JobRun.objects.filter(pk=run.pk).update(input={"sleep_in_c": 0})
    start_worker("--pool", "default")
    wait_until(lambda: status_of(run) == Status.COMPLETED, timeout=40)
    assert refreshed(run).attempts == 2
    assert (effects(run, "a"), effects(run, "b")) == (1, 1)
    assert (effects(run, "c-started"), effects(run, "c")) == (2, 1)


def test_a_failed_step_is_run_again_and_the_others_replayed(start_worker: StartWorker) -> None:
    run = start("tests.async_three_steps", {"fail_c_until": 3})
    worker = start_worker("--pool", "default", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert (refreshed(run).status, run.attempts) == (Status.COMPLETED, 3)
    assert (effects(run, "a"), effects(run, "b")) == (1, 1)
    assert (effects(run, "c-started"), effects(run, "c")) == (3, 1)


def test_a_waiting_parent_frees_the_only_async_slot_for_its_children(
    start_worker: StartWorker,
) -> None:
    parent = start("tests.async_parent", {"n": 3, "fail_first": True})
    worker = start_worker("--pool", "default", "--async-concurrency", "1", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    parent = refreshed(parent)
    assert (parent.status, parent.attempts) == (Status.COMPLETED, 2)
    assert parent.output["outputs"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert JobRun.objects.filter(parent=parent).count() == 3
    # The first attempt, its retry, and a wake-up unless the children were done first.
    assert effects(parent, "parent-body") in (2, 3)


def test_a_durable_sleep_frees_the_slot(start_worker: StartWorker) -> None:
    sleeper = start("tests.async_sleeper", {"seconds": 6})
    start_worker("--pool", "default", "--async-concurrency", "1")
    wait_until(lambda: status_of(sleeper) == Status.WAITING)
    # While it sleeps, the one async slot runs another run.
    other = start("tests.async_echo", {"x": 1})
    wait_until(lambda: status_of(other) == Status.COMPLETED, timeout=20)
    assert status_of(sleeper) == Status.WAITING
    wait_until(lambda: status_of(sleeper) == Status.COMPLETED, timeout=20)
    assert (effects(sleeper, "before"), effects(sleeper, "after")) == (1, 1)


def test_one_concurrency_key_never_overlaps_across_workers(start_worker: StartWorker) -> None:
    runs = start_many(
        "tests.async_keyed", [{"key": "account:1", "seconds": 0.02} for _ in range(50)]
    )
    start_many("tests.async_keyed", [{"seconds": 0.02} for _ in range(50)])  # no key
    workers = [
        start_worker("--pool", "default", "--async-concurrency", "20", "--burst") for _ in range(3)
    ]
    for worker in workers:
        assert worker.wait(timeout=120) == 0, worker.output()
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 2 * len(runs)
    keyed = Execution.objects.filter(job_type="keyed", run_id__in=[r.pk for r in runs])
    intervals = sorted(keyed.values_list("started_at", "finished_at"))
    assert len(intervals) == 50
    for (_, end), (next_start, _) in itertools.pairwise(intervals):
        assert end <= next_start


def test_a_pending_run_canceled_never_starts(start_worker: StartWorker) -> None:
    run = start("tests.async_cooperative", {"seconds": 1})
    assert cancel(run.pk) == 1
    worker = start_worker("--pool", "default", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert status_of(run) == Status.CANCELED
    assert effects(run, "cooperative") == 0


def test_cooperative_cancel_of_a_running_run(start_worker: StartWorker) -> None:
    run = start("tests.async_cooperative", {"seconds": 30})
    start_worker("--pool", "default")
    wait_until(lambda: effects(run, "cooperative") == 1)
    assert cancel(run.pk, reason="operator") == 1
    wait_until(lambda: status_of(run) == Status.CANCELED, timeout=15)
    run = refreshed(run)
    assert run.cancel_reason == "operator"
    assert run.error["type"] == "django_jobs.exceptions.JobCanceled"


def test_cancel_cascades_to_running_children(start_worker: StartWorker) -> None:
    parent = start("tests.async_parent", {"n": 2, "child": "tests.async_cooperative"})
    start_worker("--pool", "default")
    wait_until(lambda: status_of(parent) == Status.WAITING)
    children = list(JobRun.objects.filter(parent=parent))
    wait_until(lambda: all(effects(child, "cooperative") == 1 for child in children))
    assert cancel(parent.pk) == 3
    for run in [parent, *children]:
        wait_until(lambda run=run: status_of(run) == Status.CANCELED, timeout=15)


def test_a_handler_ignoring_cancel_is_stopped_after_the_grace(start_worker: StartWorker) -> None:
    run = start("tests.async_ignoring", {"seconds": 4})
    worker = start_worker("--pool", "default", DJANGO_JOBS_CANCEL_GRACE="1")
    wait_until(lambda: effects(run, "ignoring") == 1)
    cancel(run.pk)
    wait_until(lambda: status_of(run) == Status.CANCELED, timeout=15)
    assert "ignored the cancel request" in refreshed(run).error["message"]
    # Unlike a thread, its task was canceled: it never reaches the code after its sleep.
    time.sleep(5)
    assert effects(run, "late") == 0, worker.output()
    assert (status_of(run), refreshed(run).output) == (Status.CANCELED, None)


def test_a_timeout_stops_the_handler(start_worker: StartWorker) -> None:
    run = start("tests.async_slow", {"seconds": 3})
    worker = start_worker("--pool", "default")
    wait_until(lambda: status_of(run) == Status.TIMED_OUT, timeout=15)
    assert refreshed(run).error["type"] == "django_jobs.exceptions.JobTimeout"
    time.sleep(4)
    assert effects(run, "late") == 0, worker.output()
    assert status_of(run) == Status.TIMED_OUT


def test_sigterm_lets_async_runs_finish(start_worker: StartWorker) -> None:
    runs = start_many("tests.async_echo", [{"seconds": 2, "i": i} for i in range(5)])
    worker = start_worker("--pool", "default")
    wait_until(lambda: all(status_of(run) == Status.RUNNING for run in runs))
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert {status_of(run) for run in runs} == {Status.COMPLETED}


def test_a_drain_out_of_time_gives_async_runs_back(start_worker: StartWorker) -> None:
    runs = start_many("tests.async_echo", [{"seconds": 60}] * 3)
    worker = start_worker("--pool", "default", DJANGO_JOBS_SHUTDOWN_TIMEOUT="1")
    wait_until(lambda: all(status_of(run) == Status.RUNNING for run in runs))
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 1, worker.output()
    rows = JobRun.objects.filter(pk__in=[r.pk for r in runs])
    assert set(rows.values_list("status", "claimed_by", "lease_token")) == {
        (Status.PENDING, None, None)
    }


def test_hundreds_of_async_runs_share_a_few_connections(start_worker: StartWorker) -> None:
    name = f"djjobs-{uuid.uuid4().hex[:12]}"
    # Each run's step c waits until all 300 are in it (or 60 s): none ends before
    # the last begins unless they could not run at once.
    runs = start_many("tests.async_three_steps", [{"together_in_c": 300}] * 300)
    before = session_ids() if connections["default"].vendor == "mysql" else set()
    worker = start_worker(
        "--pool",
        "default",
        "--concurrency",
        "2",
        "--async-concurrency",
        "300",
        "--burst",
        DJANGO_JOBS_APPLICATION_NAME=name,
    )
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sessions(name, before))
            done.wait(0.01)
        connections.close_all()

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        code = worker.wait(timeout=120)
    finally:
        done.set()
        sampler.join()
    assert code == 0, worker.output()[-3000:]
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == len(runs)
    # The control connection, the listener's or the completer's, the event loop's
    # database threads, and Django's sync thread (the handlers' ORM calls); the
    # two threads for sync handlers met none, and opened none.
    assert peak <= 2 + DATABASE_THREADS + 1, (peak, worker.output()[-3000:])
    # All 300 ran at once: each one's step c began before any finished.
    starts = Execution.objects.filter(job_type="effect:c-started")
    ends = Execution.objects.filter(job_type="effect:c")
    assert starts.count() == ends.count() == 300
    assert max(starts.values_list("started_at", flat=True)) < min(
        ends.values_list("started_at", flat=True)
    )


def test_killed_connections_lose_no_async_run_and_repeat_no_recorded_step(
    start_worker: StartWorker,
) -> None:
    # Every connection of the workers' is killed, over and over: the database
    # threads', Django's sync thread's (the handlers' ORM calls), the control one.
    runs = 150
    start_many("tests.async_chaos", [{"pause": 0.05} for _ in range(runs)])
    workers = [start_worker("--pool", "default", "--async-concurrency", "40") for _ in range(2)]
    # Both started (a start whose connection is killed exits, as it should) and working.
    wait_until(lambda: Worker.objects.filter(status=WorkerStatus.RUNNING).count() == 2, 30)
    wait_until(lambda: JobStep.objects.exists(), timeout=30)
    terminated = 0
    for _ in range(5):
        terminated += terminate_other_connections()
        time.sleep(1.0)
    try:
        wait_until(
            lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == runs, timeout=120
        )
    except BaseException:
        rows = JobRun.objects.exclude(status=Status.COMPLETED)
        left = list(rows.values_list("pk", "status", "attempts", "claimed_by", "error"))
        pytest.fail(f"not completed: {left}\n" + "".join(w.output()[-3000:] for w in workers))
    assert_every_run_completed_once(runs)
    assert_alive_and_stop_cleanly(workers)
    assert terminated > 0
