"""Pool names: what is refused, the warning for a pool nothing here enqueues to, forgetting."""

from __future__ import annotations

import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobs import job, start
from django_jobs.exceptions import InvalidJobInput
from django_jobs.management.startup import warn_of_pools_without_handlers
from django_jobs.models import JobPool, JobRun, Status
from django_jobs.names import pool_problem
from django_jobs.pools import PoolInUse, forget_pool, pause_pool, resume_pool
from tests.factories import JobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

BAD = ["orders ", " orders", "my pool", "a\tb", "a\nb", "a\x07b", "a\x00b", "a\u00a0b"]


@pytest.mark.parametrize("name", BAD)
def test_whitespace_and_control_characters_are_refused(name: str) -> None:
    assert pool_problem(name) == "contains whitespace or a control character"


@pytest.mark.parametrize("name", ["default", "orders.v2", "mail-eu_1", "commandes-é"])
def test_ordinary_names_are_pool_names(name: str) -> None:
    assert pool_problem(name) is None


def test_job_start_and_the_commands_refuse_them() -> None:
    with pytest.raises(ValueError, match="'my pool' contains whitespace"):
        job("tests.spaced_pool", pool="my pool")(lambda ctx: None)
    with pytest.raises(InvalidJobInput, match="'my pool' contains whitespace"):
        start("tests.noop", pool="my pool")
    for command in (["runjobworker", "--pool"], ["jobpool", "pause"], ["jobpool", "forget"]):
        with pytest.raises(CommandError, match="no whitespace or control characters"):
            call_command(*command, "my pool")
    assert not JobRun.objects.exists()
    assert not JobPool.objects.exists()


def test_a_pool_without_a_handler_is_warned_of_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="django_jobs")
    # tests.echo's pool, the default one, and a typo.
    warn_of_pools_without_handlers(["echo", "default", "ecoh"])
    assert [r.getMessage().split()[0] for r in caplog.records] == ["pool=ecoh"]
    assert caplog.records[0].levelno == logging.WARNING
    assert "has no registered handler" in caplog.records[0].getMessage()


def jobpool(*args: str) -> str:
    out = StringIO()
    call_command("jobpool", *args, stdout=out)
    return out.getvalue()


def test_an_empty_pool_is_forgotten() -> None:
    JobPool.objects.create(name="nosuchpool")
    JobRunFactory(pool="nosuchpool", status=Status.COMPLETED, finished_at=timezone.now())
    assert jobpool("forget", "nosuchpool", "never-seen") == (
        "Forgot 'nosuchpool'.\n'never-seen' is not known.\n"
    )
    assert not JobPool.objects.exists()
    # Finished runs are history: they stay, with their pool name.
    assert JobRun.objects.filter(pool="nosuchpool").count() == 1


@pytest.mark.parametrize("status", [Status.PENDING, Status.RUNNING, Status.WAITING])
def test_a_pool_with_unfinished_runs_is_kept(status: str) -> None:
    JobPool.objects.create(name="mail")
    JobRunFactory(pool="mail", status=status)
    with pytest.raises(CommandError, match="'mail' has unfinished runs"):
        jobpool("forget", "mail")
    assert JobPool.objects.filter(name="mail").exists()


def test_a_paused_pool_is_kept_until_resumed() -> None:
    pause_pool("mail")
    with pytest.raises(PoolInUse, match="is paused: resume it first"):
        forget_pool("mail")
    resume_pool("mail")
    assert forget_pool("mail")


def test_a_pool_a_live_worker_serves_is_kept() -> None:
    JobPool.objects.create(name="mail")
    worker = WorkerFactory(pools=["default", "mail"])
    with pytest.raises(PoolInUse, match="served by a live worker"):
        forget_pool("mail")
    # A worker that stopped heartbeating long ago does not hold the pool.
    worker.heartbeat_at = timezone.now() - timedelta(hours=1)
    worker.save(update_fields=["heartbeat_at"])
    assert forget_pool("mail")
