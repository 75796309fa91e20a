"""``manage.py jobhealth`` as a probe runs it: a subprocess, beside a real worker
subprocess, and against databases that are dropped or not migrated."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.db.migrations.loader import MigrationLoader

from django_jobs.models import Worker, WorkerStatus
from tests.helpers import ROOT, WorkerProcess, on_server, wait_until, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]


def jobhealth(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "jobhealth", *args],
        cwd=ROOT,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """What the probe said: one line, on stdout when healthy and on stderr otherwise."""
    text = result.stdout if result.returncode == 0 else result.stderr
    assert "Traceback" not in result.stderr
    assert text.count("\n") == 1, (result.stdout, result.stderr)
    assert not (result.stderr if result.returncode == 0 else result.stdout)
    return text.strip()


@pytest.fixture
def scratch_database() -> Iterator[str]:
    """The name of a database of its own on the suite's server, dropped at the end."""
    name = f"jobhealth_{uuid.uuid4().hex[:12]}"
    on_server(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        on_server(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_probe_follows_a_real_workers_heartbeat(start_worker: StartWorker) -> None:
    worker = start_worker("--pool", "default", "--pool", "mail")
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), timeout=60)

    healthy = jobhealth("--pid", str(worker.pid), "--pool", "mail")
    assert healthy.returncode == 0, healthy.stderr
    said = one_line(healthy)
    assert said.startswith("healthy: database 'default' migrated; worker ")
    assert f":{worker.pid} (running) sent a heartbeat " in said
    assert jobhealth("--liveness").returncode == 0

    other_pool = jobhealth("--liveness", "--pool", "reports")
    assert other_pool.returncode == 1
    assert one_line(other_pool).endswith(" serving pool reports")

    # A stopped process writes no heartbeat (nor does its watchman: it runs no code).
    worker.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: jobhealth("--liveness").returncode == 1, timeout=60, interval=0.5)
        stale = jobhealth("--liveness", "--pid", str(worker.pid))
        assert stale.returncode == 1
        assert "last sent a heartbeat" in one_line(stale)
        assert one_line(stale).endswith("more than 3s (--max-age)")
    finally:
        worker.signal(signal.SIGCONT)
    wait_until(lambda: jobhealth("--liveness").returncode == 0, timeout=60, interval=0.5)

    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert Worker.objects.get(pid=worker.pid).status in (WorkerStatus.STOPPED, WorkerStatus.LOST)
    gone = jobhealth()
    assert gone.returncode == 1
    assert one_line(gone) == "CommandError: no live worker on host " + repr(
        Worker.objects.get(pid=worker.pid).hostname
    )


def test_a_dropped_database_is_one_line_and_status_1(scratch_database: str) -> None:
    on_server(f'DROP DATABASE "{scratch_database}"')
    for kind in ("--readiness", "--liveness"):
        result = jobhealth(kind, DJANGO_JOBS_USE_DB=scratch_database)
        assert result.returncode == 1
        said = one_line(result)
        assert said.startswith("CommandError: cannot use database 'default' (")
        assert scratch_database in said


def test_an_unmigrated_database_is_not_ready(scratch_database: str) -> None:
    unready = jobhealth("--readiness", DJANGO_JOBS_USE_DB=scratch_database)
    assert unready.returncode == 1
    said = one_line(unready)
    assert " migration(s) not applied on database 'default' (" in said
    assert said.endswith("more; run `manage.py migrate`")

    dead = jobhealth("--liveness", DJANGO_JOBS_USE_DB=scratch_database)
    assert dead.returncode == 1
    assert "the django_jobs tables are missing in database 'default'" in one_line(dead)


def migrate(database: str, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "migrate", *args, "-v", "0"],
        cwd=ROOT,
        env=worker_env(DJANGO_JOBS_USE_DB=database),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr


def test_a_migration_left_to_apply_is_named(scratch_database: str) -> None:
    migrate(scratch_database)
    assert jobhealth("--readiness", DJANGO_JOBS_USE_DB=scratch_database).returncode == 0
    # As if the latest migration came with a deploy: back to the one before it.
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    ((_, last),) = graph.leaf_nodes("django_jobs")
    parents = graph.node_map[("django_jobs", last)].parents
    (before,) = [name for app, name in parents if app == "django_jobs"]
    migrate(scratch_database, "django_jobs", before)
    result = jobhealth("--readiness", DJANGO_JOBS_USE_DB=scratch_database)
    assert result.returncode == 1
    assert one_line(result) == (
        "CommandError: 1 migration(s) not applied on database 'default' "
        f"({result_where(scratch_database)}): django_jobs.{last}; "
        "run `manage.py migrate`"
    )
    # Liveness is about the worker: no worker runs here, whatever the migrations.
    dead = jobhealth("--liveness", DJANGO_JOBS_USE_DB=scratch_database)
    assert one_line(dead).startswith("CommandError: no live worker on host ")


def result_where(database: str) -> str:
    """host:port/name of ``database`` on the suite's server, as the probe names it."""
    from django.db import connection

    host = connection.settings_dict["HOST"] or "localhost"
    port = connection.settings_dict["PORT"]
    return f"{host}{':' + str(port) if port else ''}/{database}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-age", "0"], "argument --max-age: expected a positive number of seconds"),
        (["--max-age", "nan"], "argument --max-age: expected a positive number of seconds"),
        (["--pid", "-1"], "argument --pid: expected a positive integer, got '-1'"),
        (["--pool", "a b"], "argument --pool: expected a pool name"),
        (["--hostname", ""], "argument --hostname: expected a hostname"),
        (["--database", "nope"], "argument --database: expected a database alias of DATABASES"),
        (["--readiness", "--liveness"], "not allowed with argument --readiness"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = jobhealth(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
