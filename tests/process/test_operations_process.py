"""A real worker and the operations commands: pause/resume with ``jobpool``, ``jobstatus``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from django_jobs import start
from django_jobs.models import JobRun, Status
from tests.helpers import ROOT, WorkerProcess, wait_until, worker_env

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
