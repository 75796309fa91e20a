"""PostgreSQL restarted while workers claim, run steps and complete.

Runs where the suite uses the machine's own PostgreSQL cluster and may restart
it (root, ``pg_ctlcluster``); an embedded server is not restarted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_jobs import start_many
from django_jobs.models import JobRun, JobStep, Status
from tests.helpers import wait_until
from tests.process.faults import (
    StartWorker,
    assert_alive_and_stop_cleanly,
    assert_every_run_completed_once,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.process,
    pytest.mark.postgresql("restarts the PostgreSQL server"),
]

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


def postmaster_start() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def test_a_postgresql_restart_loses_no_run_and_repeats_no_recorded_step(
    start_worker: StartWorker,
) -> None:
    version = local_cluster()
    if version is None:
        pytest.skip("needs the machine's own PostgreSQL cluster, restartable as root")
    start_many("tests.chaos", [{"pause": 0.05} for _ in range(RUNS)])
    workers = [start_worker("--pool", "default", "--concurrency", "4") for _ in range(2)]
    wait_until(lambda: JobStep.objects.count() > 30, timeout=30)
    booted = postmaster_start()
    connection.close()
    cluster = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main"]
    try:
        subprocess.run([*cluster, "restart", "-m", "fast"], capture_output=True, timeout=60)
    finally:
        # Whatever happened, leave the machine's server running.
        deadline = time.monotonic() + 30
        while subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"]).returncode != 0:
            subprocess.run([*cluster, "start"], capture_output=True, timeout=60)
            assert time.monotonic() < deadline, "PostgreSQL did not come back"
            time.sleep(0.5)
    assert postmaster_start() > booted, "the server was not restarted"
    wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == RUNS, timeout=120)
    assert_every_run_completed_once(RUNS)
    assert_alive_and_stop_cleanly(workers)
