"""A worker behind a real PgBouncer in transaction mode (issue 17).

Through the pooler a LISTEN succeeds and then hears nothing; the worker finds
that out by itself (its probe goes unheard), says so once, and polls. Every
durable feature then works as on a direct connection. Skipped where
Debian's ``pgbouncer`` is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_jobs import cancel, start
from django_jobs.models import JobRun, JobStep, Status
from tests.helpers import WorkerProcess, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.process,
    pytest.mark.postgresql("PgBouncer"),
]

StartWorker = Callable[..., WorkerProcess]
PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
)
WARNING = "LISTEN/NOTIFY does not reach this worker"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def pgbouncer() -> Iterator[int]:
    """A PgBouncer in transaction mode in front of the test database; its port."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (Debian's package pgbouncer)")
    settings = connection.settings_dict
    if settings["HOST"] not in ("127.0.0.1", "localhost"):
        pytest.skip("the PgBouncer test needs the database on this machine")
    port = free_port()
    # Not under pytest's tmp_path: its parents are closed to the postgres user.
    home = Path(tempfile.mkdtemp(prefix="django-jobs-pgbouncer-"))
    (home / "users.txt").write_text(f'"{settings["USER"]}" ""\n')
    (home / "pgbouncer.ini").write_text(
        f"""
[databases]
* = host={settings["HOST"]} port={settings["PORT"] or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {home / "users.txt"}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options,application_name
logfile = {home / "pgbouncer.log"}
"""
    )
    if _root():  # pgbouncer refuses to run as root: it runs as postgres
        for path in [home, *home.iterdir()]:
            shutil.chown(path, "postgres")
    command = [PGBOUNCER, *(["-u", "postgres"] if _root() else []), str(home / "pgbouncer.ini")]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = home / "pgbouncer.log"
                pytest.fail(f"pgbouncer did not start: {log.read_text() if log.exists() else ''}")
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(home, ignore_errors=True)


def _root() -> bool:
    import os

    return os.geteuid() == 0


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def status(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def test_a_worker_behind_pgbouncer_polls_by_itself(
    start_worker: StartWorker, pgbouncer: int
) -> None:
    user = connection.settings_dict["USER"]
    worker = start_worker(
        "--pool",
        "default",
        "--pool",
        "echo",
        "--concurrency",
        "2",
        DATABASE_URL=f"postgres://{user}@127.0.0.1:{pgbouncer}/postgres",
        DJANGO_JOBS_PREPARED_STATEMENTS="0",
        DJANGO_JOBS_CANCEL_GRACE="1",
    )
    wait_until(lambda: WARNING in worker.output(), timeout=30)
    stepped = start("tests.three_steps", {})
    parent = start("tests.parent", {"n": 3})
    sleeper = start("tests.sleeper", {"seconds": 0.3})
    retried = start("tests.flaky", {"succeed_on": 2})
    doomed = start("tests.cooperative", {})
    wait_until(lambda: status(doomed) == Status.RUNNING, timeout=30)
    cancel(doomed.pk)
    expected = {
        stepped.pk: Status.COMPLETED,
        parent.pk: Status.COMPLETED,
        sleeper.pk: Status.COMPLETED,
        retried.pk: Status.COMPLETED,
        doomed.pk: Status.CANCELED,
    }
    wait_until(
        lambda: (
            dict(JobRun.objects.filter(pk__in=expected).values_list("pk", "status")) == expected
        ),
        timeout=60,
    )
    assert JobStep.objects.filter(run=stepped).count() == 3
    assert worker.output().count(WARNING) == 1
    assert worker.proc.poll() is None, worker.output()


def test_a_worker_on_a_direct_connection_listens(start_worker: StartWorker) -> None:
    worker = start_worker("--pool", "default", "-v", "2")
    run = start("tests.noop")
    wait_until(lambda: status(run) == Status.COMPLETED, timeout=30)
    assert WARNING not in worker.output()
