"""``manage.py jobhealth`` on real Worker rows and migration records, in this process
(tests/process/test_jobhealth_process.py probes a real worker subprocess)."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings
from django.utils import timezone

from django_jobs.health import default_max_age
from django_jobs.models import WorkerStatus
from tests.factories import WorkerFactory

pytestmark = pytest.mark.django_db

HOST = socket.gethostname()


def probe(*args: str) -> tuple[int, str]:
    """The exit status and the one line ``jobhealth`` says (stdout, or its error)."""
    out = StringIO()
    try:
        call_command("jobhealth", *args, stdout=out)
    except CommandError as exc:
        code, text = exc.returncode, str(exc) + "\n"
    else:
        code, text = 0, out.getvalue()
    assert text.count("\n") == 1, text
    return code, text.strip()


def beat(seconds_ago: float, **fields: object) -> object:
    return WorkerFactory(heartbeat_at=timezone.now() - timedelta(seconds=seconds_ago), **fields)


def test_a_fresh_worker_on_this_host_and_no_pending_migration_is_healthy() -> None:
    beat(0.5, pid=4242)
    code, said = probe()
    assert code == 0
    assert said.startswith("healthy: database 'default' migrated; ")
    assert f"worker {HOST}:4242 (running) sent a heartbeat " in said


def test_no_worker_on_this_host_is_unhealthy() -> None:
    beat(0, hostname="elsewhere")
    assert probe() == (1, f"no live worker on host {HOST!r}")
    assert probe("--hostname", "elsewhere")[0] == 0


@pytest.mark.parametrize("status", [WorkerStatus.STOPPED, WorkerStatus.LOST])
def test_a_worker_that_stopped_or_was_lost_is_no_live_worker(status: str) -> None:
    beat(0, status=status)  # stopping writes a last heartbeat: recent, yet gone
    assert probe("--liveness") == (1, f"no live worker on host {HOST!r}")


def test_a_draining_worker_is_alive() -> None:
    beat(0, status=WorkerStatus.STOPPING, pid=7)
    code, said = probe("--liveness")
    assert (code, said.endswith("ago")) == (0, True)
    assert f"{HOST}:7 (stopping)" in said


def test_a_stale_heartbeat_is_unhealthy_with_its_age() -> None:
    # The test settings: HEARTBEAT_INTERVAL 1 s, STALE_THRESHOLD 3 s.
    assert default_max_age() == 3.0
    beat(20, pid=99)
    code, said = probe("--liveness")
    assert code == 1
    assert said.startswith(f"worker {HOST}:99 (running) last sent a heartbeat 2")
    assert said.endswith("s ago, more than 3s (--max-age)")
    assert probe("--liveness", "--max-age", "60")[0] == 0


def test_the_default_max_age_is_three_heartbeats_within_the_stale_threshold() -> None:
    with override_settings(DJANGO_JOBS={"HEARTBEAT_INTERVAL": 10, "STALE_THRESHOLD": 60}):
        assert default_max_age() == 30.0
    with override_settings(DJANGO_JOBS={"HEARTBEAT_INTERVAL": 10, "STALE_THRESHOLD": 25}):
        assert default_max_age() == 25.0


def test_the_newest_heartbeat_of_the_host_counts() -> None:
    # A restarted container: its dead worker's row is stale, the new one's fresh.
    beat(600, pid=1)
    beat(0.2, pid=8)
    code, said = probe("--liveness")
    assert code == 0
    assert f"{HOST}:8 " in said


def test_pid_and_pools_narrow_the_workers_that_count() -> None:
    beat(0, pid=11, pools=["orders", "mail"])
    assert probe("--pid", "11", "--pool", "orders", "--pool", "mail")[0] == 0
    assert probe("--pid", "12") == (1, f"no live worker on host {HOST!r} with pid 12")
    assert probe("--pool", "reports") == (
        1,
        f"no live worker on host {HOST!r} serving pool reports",
    )


def test_a_pending_migration_fails_readiness_but_not_liveness() -> None:
    beat(0)
    ((app, last),) = MigrationLoader(connection).graph.leaf_nodes("django_jobs")
    MigrationRecorder(connection).record_unapplied(app, last)  # rolled back after the test
    code, said = probe()
    assert code == 1
    assert said.startswith("1 migration(s) not applied on database 'default' (")
    assert f"/{connection.settings_dict['NAME']}): " in said
    assert said.endswith(f"): django_jobs.{last}; run `manage.py migrate`")
    assert probe("--readiness")[0] == 1
    assert probe("--liveness")[0] == 0


def test_readiness_needs_no_worker() -> None:
    assert probe("--readiness") == (0, "healthy: database 'default' migrated")


def test_bad_settings_are_one_line() -> None:
    with override_settings(DJANGO_JOBS={"HEARTBEAT_INTERVAL": "often"}):
        code, said = probe()
    assert code == 1
    assert said == (
        "settings.DJANGO_JOBS: HEARTBEAT_INTERVAL must be seconds or a timedelta, got 'often'"
    )


def test_quiet_when_healthy_at_verbosity_0() -> None:
    beat(0, pid=os.getpid())
    out = StringIO()
    call_command("jobhealth", verbosity=0, stdout=out)
    assert out.getvalue() == ""
