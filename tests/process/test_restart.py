"""PostgreSQL restarted while workers claim, run steps and complete.

Runs where the suite uses the machine's own PostgreSQL cluster and may restart
it (root, ``pg_ctlcluster``); an embedded server is not restarted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from django_jobs import start_many
from django_jobs.models import JobRun, JobStep, Status
from tests.helpers import WorkerProcess, wait_until
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

StartWorker = Callable[..., WorkerProcess]
RUNS = 150


def local_cluster() -> str | None:
    """The version of the local cluster this suite runs on, when it may be restarted."""
    host = connection.settings_dict.get("HOST") or ""
    clusters = Path("/etc/postgresql")
    if host not in ("127.0.0.1", "localhost") or not shutil.which("pg_ctlcluster"):
        return None
    if os.geteuid() != 0 or not clusters.is_dir():
        return None
    versions = sorted(p.name for p in clusters.iterdir())
    return versions[0] if versions else None


def test_a_postgresql_restart_loses_no_run_and_repeats_no_recorded_step(
    start_worker: StartWorker,
) -> None:
    version = local_cluster()
    if version is None:
        pytest.skip("needs the machine's own PostgreSQL cluster, restartable as root")
    start_many("tests.chaos", [{"pause": 0.05} for _ in range(RUNS)])
    workers = [start_worker("--pool", "default", "--concurrency", "4") for _ in range(2)]
    wait_until(lambda: JobStep.objects.count() > 30, timeout=30)
    connection.close()
    restart = [
        "pg_ctlcluster",
        "--skip-systemctl-redirect",
        version,
        "main",
        "restart",
        "-m",
        "fast",
    ]
    subprocess.run(restart, check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"]).returncode != 0:
        assert time.monotonic() < deadline, "PostgreSQL did not come back"
        time.sleep(0.2)
    wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == RUNS, timeout=120)
    assert JobRun.objects.filter(output=3).count() == RUNS
    for step in JobStep.objects.filter(status="completed").iterator():
        assert not Execution.objects.filter(
            run_id=step.run_id,
            job_type=f"effect:{step.step_id}",
            started_at__gt=step.finished_at,
        ).exists(), f"step {step.step_id} of run {step.run_id} ran again"
    assert not JobRun.objects.filter(status=Status.RUNNING).exists()
    for worker in workers:
        assert worker.proc.poll() is None, worker.output()[-2000:]
        worker.signal(15)
        assert worker.wait(timeout=60) == 0, worker.output()[-2000:]
