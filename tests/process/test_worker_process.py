"""Real ``runjobworker`` subprocesses against the test database."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
from django.db.models import Count

from django_jobs import start, start_many
from django_jobs.models import UNFINISHED_STATUSES, JobRun, Status, Worker, WorkerStatus
from tests.helpers import ROOT, WorkerProcess, all_running, stop_all, wait_until, worker_env
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def status_of(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def test_three_workers_complete_every_run_exactly_once(start_worker: StartWorker) -> None:
    workers = all_running(start_worker, 3, "--pool", "default", "--concurrency", "2")
    runs = start_many("tests.record", [{"n": n} for n in range(6000)])
    wait_until(
        lambda: not JobRun.objects.filter(status__in=UNFINISHED_STATUSES).exists(),
        timeout=240,
        interval=0.5,
    )
    stop_all(workers)
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == len(runs)
    executions = Execution.objects.values("run_id").annotate(n=Count("id"))
    assert executions.count() == len(runs)
    assert {row["n"] for row in executions} == {1}
    # All three took part: the claims interleaved across processes.
    assert Execution.objects.values("pid").distinct().count() == 3


def test_sigterm_drains_the_running_run_and_exits_zero(start_worker: StartWorker) -> None:
    run = start("tests.sleep", {"seconds": 2})
    worker = start_worker("--pool", "default")
    wait_until(lambda: status_of(run) == Status.RUNNING)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert status_of(run) == Status.COMPLETED
    assert Worker.objects.get().status == WorkerStatus.STOPPED


def test_sigterm_past_the_shutdown_timeout_releases_the_run(start_worker: StartWorker) -> None:
    run = start("tests.sleep", {"seconds": 30})
    worker = start_worker("--pool", "default", DJANGO_JOBS_SHUTDOWN_TIMEOUT="0.5")
    wait_until(lambda: status_of(run) == Status.RUNNING)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 1, worker.output()
    run.refresh_from_db()
    assert (run.status, run.attempts, run.claimed_by_id) == (Status.PENDING, 0, None)
    assert "released 1 unfinished runs" in worker.output()


def test_second_signal_exits_at_once(start_worker: StartWorker) -> None:
    run = start("tests.sleep", {"seconds": 30})
    worker = start_worker("--pool", "default", DJANGO_JOBS_SHUTDOWN_TIMEOUT="60")
    wait_until(lambda: status_of(run) == Status.RUNNING)
    worker.signal(signal.SIGINT)
    wait_until(lambda: Worker.objects.filter(status=WorkerStatus.STOPPING).exists(), timeout=10)
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=10) == 1, worker.output()
    assert status_of(run) == Status.PENDING


def test_sigkilled_workers_run_is_rescued_by_another_worker(start_worker: StartWorker) -> None:
    run = start("tests.sleep", {"seconds": 30})
    victim = start_worker("--pool", "default")
    wait_until(lambda: Execution.objects.filter(run_id=run.pk).exists())
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    JobRun.objects.filter(pk=run.pk).update(input={"seconds": 1.5})  # short the next time
    rescuer = start_worker("--pool", "default")
    # Stale threshold is 3 s in the test settings; then the rescued run re-runs.
    wait_until(lambda: status_of(run) == Status.COMPLETED, timeout=30)
    run.refresh_from_db()
    assert run.attempts == 2
    assert Execution.objects.filter(run_id=run.pk).count() == 2
    assert "rescued runs of stale workers requeued=1" in rescuer.output()
    assert Worker.objects.get(pid=victim.pid).status == WorkerStatus.LOST


def test_poison_run_fails_once_its_attempts_are_spent(start_worker: StartWorker) -> None:
    run = start("tests.poison")  # two attempts; each kills its worker
    for _ in range(2):
        worker = start_worker("--pool", "default")
        assert worker.wait(timeout=30) == -signal.SIGKILL
    survivor = start_worker("--pool", "default")
    wait_until(lambda: status_of(run) == Status.FAILED, timeout=30)
    run.refresh_from_db()
    assert run.attempts == 2
    assert run.error["type"] == "django_jobs.exceptions.WorkerLost"
    assert Execution.objects.filter(run_id=run.pk).count() == 2
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0


def test_one_line_per_outcome_and_no_payloads(start_worker: StartWorker) -> None:
    start("tests.echo", {"secret": "hunter2"})
    worker = start_worker("--pool", "echo", "--burst")
    assert worker.wait(timeout=60) == 0
    output = worker.output()
    assert "type=tests.echo outcome=completed attempt=1" in output
    assert "hunter2" not in output


def test_a_runs_exception_adds_no_line_to_the_log_and_is_cut(start_worker: StartWorker) -> None:
    """A handler's exception message quotes what a caller sent: with a line break
    it must not write a line that reads like a record, and its size is bounded as
    the stored error is (a 10,000,000-character message once wrote 20 MB)."""
    forged = "\n2026-12-05 07:00:00,000 INFO django_jobs.execution run=1 outcome=completed"
    start("tests.fails_with", {"message": "boom" + forged + "\n"})
    start("tests.fails_with", {"message": "z", "times": 10_000_000})
    worker = start_worker("--pool", "default", "--burst")
    assert worker.wait(timeout=120) == 0
    output = worker.output()
    record = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    records = [line for line in output.splitlines() if record.match(line)]
    outcomes = [line for line in records if " outcome=" in line]
    assert len(outcomes) == 2, output[:5000]
    assert all("outcome=failed" in line for line in outcomes), outcomes
    assert "\\n2026-12-05 07:00:00,000 INFO" in output  # shown, escaped, inside its record
    assert len(output) < 200_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "expected an integer from 1 to 1000, got '0'"),
        (["--concurrency", "abc"], "expected an integer from 1 to 1000, got 'abc'"),
        (["--async-concurrency", "-1"], "expected an integer from 0 to 10000, got '-1'"),
        (["--async-concurrency", "1e3"], "expected an integer from 0 to 10000, got '1e3'"),
        (["--max-runs", "-3"], "expected a positive integer, got '-3'"),
        (["--poll-interval", "nan"], "expected a positive number of seconds"),
        (["--poll-interval", "1e12"], "expected a positive number of seconds up to 86400"),
        (["--pool", ""], "expected a pool name"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--metrics-port", "0"], "expected a TCP port (1-65535), got '0'"),
        (["--metrics-port", "http"], "expected a TCP port (1-65535), got 'http'"),
        (["--metrics-port", "70000"], "expected a TCP port (1-65535), got '70000'"),
    ],
)
def test_bad_flags_exit_non_zero_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobworker", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not JobRun.objects.exists()
    assert not Worker.objects.exists()


def test_bad_settings_stop_the_worker_before_it_starts() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobworker", "--burst"],
        cwd=ROOT,
        env=worker_env(DJANGO_JOBS_HEARTBEAT_INTERVAL="-1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "django_jobs.E001" in result.stderr
    assert not Worker.objects.exists()
