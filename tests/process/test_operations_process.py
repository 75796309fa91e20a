"""A real worker and the operations commands: pause/resume with ``jobpool``, ``jobstatus``."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from django_jobs import start
from django_jobs.models import JobRun, Status
from tests.helpers import ROOT, WorkerProcess, terminate_other_connections, wait_until, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


def manage(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def status_of(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def test_a_running_worker_stops_and_restarts_claiming_a_paused_pool(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    assert manage("jobpool", "pause", "echo", "--reason", "maintenance") == "Paused 'echo'.\n"
    worker = start_worker("--pool", "echo", "--pool", "default", "--concurrency", "2")
    held_back = start("tests.echo", {"n": 1})  # pool "echo"
    marker = start("tests.noop")  # pool "default", started after
    # The claim that took the marker saw the echo run too, in the same batch of two.
    wait_until(lambda: status_of(marker) == Status.COMPLETED)
    assert status_of(held_back) == Status.PENDING

    shown = json.loads(manage("jobstatus", "--json", "--pool", "echo"))
    (echo,) = shown["pools"]
    assert (echo["paused"], echo["pause_reason"]) == (True, "maintenance")
    assert (echo["counts"]["pending"], echo["workers"]) == (1, 1)

    assert manage("jobpool", "resume", "echo") == "Resumed 'echo'.\n"
    wait_until(lambda: status_of(held_back) == Status.COMPLETED)
    text = manage("jobstatus")
    assert "echo" in text
    assert "Workers (1)" in text
    worker.signal(15)
    assert worker.wait(timeout=30) == 0, worker.output()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_a_worker_serves_prometheus_metrics(start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    worker = start_worker(
        "--pool", "echo", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"
    )
    run = start("tests.echo", {"n": 1})
    wait_until(lambda: status_of(run) == Status.COMPLETED)
    labels = 'job_type="tests.echo",outcome="completed",pool="echo"'

    def counted() -> bool:
        try:
            return f"django_jobs_runs_total{{{labels}}} 1.0" in scrape(port)
        except OSError:
            return False  # not listening yet

    wait_until(counted)
    text = scrape(port)
    assert f"django_jobs_run_duration_seconds_count{{{labels}}} 1.0" in text
    assert 'django_jobs_pool_workers{pool="echo"} 1.0' in text
    assert "django_jobs_queue_up 1.0" in text
    busy = start_worker("--pool", "echo", "--metrics-port", str(port))
    assert busy.wait(timeout=60) != 0
    assert f"--metrics-port {port}: cannot listen" in busy.output()
    worker.signal(15)
    assert worker.wait(timeout=30) == 0, worker.output()


def test_jobstatus_watch_reconnects_after_its_connection_is_killed(tmp_path: Path) -> None:
    out = (tmp_path / "out").open("w+")
    err = (tmp_path / "err").open("w+")
    watch = subprocess.Popen(
        [sys.executable, "-m", "django", "jobstatus", "--watch", "0.2", "--json"],
        cwd=ROOT,
        env=worker_env(),
        stdout=out,
        stderr=err,
        text=True,
    )
    try:
        wait_until(lambda: len((tmp_path / "out").read_text().splitlines()) >= 2)
        terminate_other_connections()
        wait_until(lambda: "cannot read the queue" in (tmp_path / "err").read_text())
        seen = len((tmp_path / "out").read_text().splitlines())
        wait_until(lambda: len((tmp_path / "out").read_text().splitlines()) >= seen + 2)
        assert watch.poll() is None  # still watching
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=30) == 0
        assert "Traceback" not in (tmp_path / "err").read_text()
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(timeout=10)
        out.close()
        err.close()
