"""Commands facing a database they cannot use, or bad arguments: a line or two, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from django_jobs.models import JobPool, JobRun, Worker
from tests.helpers import ROOT, WorkerProcess, on_server, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

COMMANDS = [
    ["runjobworker", "--start-timeout", "0.5"],
    ["prunejobs"],
    ["jobpool", "list"],
    ["jobpool", "pause", "mail"],
    ["jobstatus"],
]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def command_error(stderr: str) -> list[str]:
    """The lines of the CommandError the command ended with."""
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("CommandError: "))
    return lines[start:]


def nothing_listens() -> str:
    """A URL of a port where nothing listens (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    scheme = urlsplit(os.environ["DATABASE_URL"]).scheme  # the suite's kind of server
    user = "root" if scheme.startswith(("mysql", "mariadb")) else "postgres"
    return f"{scheme}://{user}@127.0.0.1:{port}/nowhere"


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database on the suite's server without the django_jobs tables."""
    name = f"unmigrated_{uuid.uuid4().hex[:12]}"
    on_server(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        on_server(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_unreachable_database_is_two_lines(command: list[str]) -> None:
    url = nothing_listens()
    result = manage(*command, DATABASE_URL=url, DJANGO_JOBS_USE_DB="nowhere")
    assert result.returncode == 1
    error = command_error(result.stderr)
    assert len(error) == 2, error
    port = urlsplit(url).port
    assert error[0].startswith("CommandError: Cannot use the jobs database 'default' "), error
    assert f"127.0.0.1:{port}/nowhere" in error[0]
    assert ("Can't connect" if "mysql" in url else "Connection refused") in error[0]
    assert "Check that the server runs" in error[1]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_missing_tables_say_to_migrate(command: list[str], empty_database: str) -> None:
    result = manage(*command, DJANGO_JOBS_USE_DB=empty_database)
    assert result.returncode == 1
    error = command_error(result.stderr)
    assert len(error) == 2, error
    assert "The django_jobs tables are missing in database 'default'" in error[0]
    assert empty_database in error[0]
    assert error[1] == "Run `manage.py migrate django_jobs` first."


def test_the_worker_retries_its_start_for_the_start_timeout() -> None:
    result = manage(
        "runjobworker",
        "--start-timeout",
        "2",
        DATABASE_URL=nothing_listens(),
        DJANGO_JOBS_USE_DB="x",
    )
    assert result.returncode == 1
    retries = [line for line in result.stderr.splitlines() if "unavailable" in line]
    assert len(retries) >= 2  # it tried again before giving up
    assert "WARNING" in retries[0]
    assert "(retried for 2s)" in command_error(result.stderr)[0]


def test_help_says_how_long_the_worker_waits_for_the_database() -> None:
    result = manage("runjobworker", "--help")
    assert result.returncode == 0
    assert "--start-timeout S" in result.stdout
    assert "exits with status 1" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runjobworker", "--concurrency", "100000"], "expected an integer from 1 to 1000"),
        (["runjobworker", "--pool", "my pool"], "no whitespace or control characters"),
        (["runjobworker", "--start-timeout", "-1"], "expected a positive number of seconds"),
        (["prunejobs", "--older-than", "soon"], "expected an age such as 30d"),
        (["jobstatus", "--window", "0s"], "expected an age such as"),
        (["jobpool", "pause"], "the following arguments are required: POOL"),
        (["jobpool", "forget", "a\tb"], "no whitespace or control characters"),
        (["jobpool"], "the following arguments are required: ACTION"),
    ],
)
def test_argument_errors_are_one_line(args: list[str], message: str) -> None:
    result = manage(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert "usage:" not in result.stderr
    assert "(see --help)" in result.stderr


def test_a_pool_without_a_handler_is_warned_of_and_served(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    worker = start_worker("--pool", "nosuchpool", "--burst")
    assert worker.wait(timeout=60) == 0
    assert "WARNING" in worker.output()
    assert "pool=nosuchpool has no registered handler in this process" in worker.output()
    assert not JobRun.objects.exists()
    assert Worker.objects.get().pools == ["nosuchpool"]


def test_a_mistyped_pool_leaves_jobstatus_when_its_worker_stops(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    worker = start_worker("--pool", "nosuchpool", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert JobPool.objects.filter(name="nosuchpool").exists()  # served: recorded
    result = manage("jobstatus", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pools"] == []
    # A paused pool stays listed whatever else it has.
    assert manage("jobpool", "pause", "nosuchpool").returncode == 0
    [pool] = json.loads(manage("jobstatus", "--json").stdout)["pools"]
    assert (pool["pool"], pool["paused"]) == ("nosuchpool", True)


def test_the_worker_refuses_to_start_in_the_test_mode_of_run_on_commit() -> None:
    result = manage("runjobworker", DJANGO_SETTINGS_MODULE="tests.process.run_on_commit_settings")
    assert result.returncode == 1
    assert command_error(result.stderr) == [
        "CommandError: DJANGO_JOBS['RUN_ON_COMMIT'] is True: in this test mode a run runs in "
        "the process that starts it, when its transaction commits, and no worker runs it. "
        "Start runjobworker with settings that leave RUN_ON_COMMIT False."
    ]
    assert not Worker.objects.exists()
