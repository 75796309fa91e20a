"""``status.snapshot`` and ``manage.py jobstatus``: counts, lag, throughput, workers, progress."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.utils import timezone

from django_jobs.models import Status, WorkerStatus
from django_jobs.pools import declared_pools, pause_pool, resume_pool
from django_jobs.snapshot import snapshot
from django_jobs.storage import workers
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def populate() -> None:
    """Two pools with runs in every state, old and recent, and three workers."""
    now = timezone.now()
    live = WorkerFactory(pools=["default", "mail"], concurrency=8)
    WorkerFactory(pools=["mail"], heartbeat_at=now - timedelta(minutes=5))  # stale
    WorkerFactory(pools=["mail"], status=WorkerStatus.STOPPED)
    JobRunFactory(run_at=now - timedelta(seconds=90))
    JobRunFactory(run_at=now - timedelta(seconds=30))
    JobRunFactory(run_at=now + timedelta(hours=1))  # pending, not due: no lag
    RunningJobRunFactory(
        claimed_by=live, progress={"done": 3, "total": 4, "message": "almost", "at": now}
    )
    JobRunFactory(pool="mail", status=Status.WAITING)
    for minutes, status in [(1, Status.COMPLETED), (2, Status.COMPLETED), (3, Status.FAILED)]:
        JobRunFactory(status=status, finished_at=now - timedelta(minutes=minutes))
    JobRunFactory(status=Status.COMPLETED, finished_at=now - timedelta(hours=2))  # outside
    JobRunFactory(pool="mail", status=Status.TIMED_OUT, finished_at=now - timedelta(seconds=5))


def test_the_snapshot_counts_per_pool() -> None:
    populate()
    pause_pool("reports", reason="quarter end")
    shot = snapshot(window=timedelta(minutes=5))
    pools = {pool.name: pool for pool in shot.pools}
    assert list(pools) == ["default", "mail", "reports"]
    default, mail, reports = pools["default"], pools["mail"], pools["reports"]
    assert default.counts == {
        "pending": 3,
        "running": 1,
        "waiting": 0,
        "completed": 2,
        "failed": 1,
        "timed_out": 0,
        "canceled": 0,
    }
    assert default.oldest_pending is not None
    assert timedelta(seconds=90) <= default.oldest_pending < timedelta(minutes=10)
    assert shot.runs_per_minute(default) == pytest.approx(3 / 5)
    assert default.workers == 1
    assert (mail.counts["waiting"], mail.counts["timed_out"], mail.workers) == (1, 1, 1)
    assert mail.oldest_pending is None
    assert (reports.paused, reports.pause_reason, reports.finished()) == (True, "quarter end", 0)
    assert [w.stale for w in shot.workers] == [False, True]
    (progress,) = shot.progress
    assert (progress.done, progress.total, progress.message, progress.percent) == (
        3,
        4,
        "almost",
        75.0,
    )


def test_ages_are_measured_on_the_database_clock_not_the_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host whose clock runs an hour ahead (a web process reading the status)
    must not see every worker stale and every run an hour late."""
    populate()
    ahead = timezone.now() + timedelta(hours=1)
    monkeypatch.setattr("django_jobs.snapshot.timezone.now", lambda: ahead)
    shot = snapshot(window=timedelta(minutes=5))
    pools = {pool.name: pool for pool in shot.pools}
    assert pools["default"].oldest_pending is not None
    assert pools["default"].oldest_pending < timedelta(minutes=10)
    assert [w.stale for w in shot.workers] == [False, True]
    assert shot.workers[0].heartbeat_age < timedelta(minutes=1)
    assert shot.runs_per_minute(pools["default"]) == pytest.approx(3 / 5)
    (progress,) = shot.progress
    assert progress.running_for is not None
    assert progress.running_for < timedelta(minutes=1)


def test_the_snapshot_can_be_limited_to_pools_and_has_a_short_window() -> None:
    populate()
    shot = snapshot(window=timedelta(seconds=30), pools=["mail"])
    assert [pool.name for pool in shot.pools] == ["mail"]
    assert shot.pools[0].counts["timed_out"] == 1
    assert shot.progress == []  # the running run is in "default"
    with pytest.raises(ValueError, match="window"):
        snapshot(window=timedelta(0))


def test_an_empty_queue_has_an_empty_snapshot() -> None:
    shot = snapshot()
    assert (shot.pools, shot.workers, shot.progress) == ([], [], [])


def jobstatus(*args: str) -> str:
    out = StringIO()
    call_command("jobstatus", *args, stdout=out)
    return out.getvalue()


def test_jobstatus_prints_a_table_workers_and_progress() -> None:
    populate()
    pause_pool("mail", reason="smtp down")
    text = jobstatus()
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("pool"))
    assert header.split() == [
        "pool",
        "state",
        "pending",
        "oldest",
        "running",
        "waiting",
        "completed/5m",
        "failed/5m",
        "timed_out/5m",
        "canceled/5m",
        "runs/min",
        "workers",
    ]
    default = next(line for line in lines if line.startswith("default"))
    assert default.split()[:3] == ["default", "active", "3"]
    assert default.split()[4:] == ["1", "0", "2", "1", "0", "0", "0.6", "1"]
    assert next(line for line in lines if line.startswith("mail")).split()[1] == "paused"
    assert "mail paused for" in text
    assert "smtp down" in text
    assert "Workers (2)" in text
    assert "STALE" in text
    assert "3/4 75%" in text
    assert "almost" in text


def test_jobstatus_json_is_one_document_with_every_number() -> None:
    populate()
    data = json.loads(jobstatus("--json", "--window", "10m"))
    assert data["window_seconds"] == 600
    default = next(pool for pool in data["pools"] if pool["pool"] == "default")
    assert default["counts"]["completed"] == 2
    assert default["runs_per_minute"] == pytest.approx(0.3)
    assert default["oldest_pending_seconds"] >= 90
    assert default["paused"] is False
    assert {worker["stale"] for worker in data["workers"]} == {True, False}
    assert data["progress"][0]["total"] == 4


def test_jobstatus_watch_prints_until_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    populate()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    lines = jobstatus("--watch", "0.5", "--json").splitlines()
    assert len(lines) == 3
    assert all(json.loads(line)["pools"] for line in lines)
    assert sleeps == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    "args",
    [
        ["--window", "0m"],
        ["--window", "soon"],
        ["--watch", "0"],
        ["--watch", "-1"],
        ["--watch", "1e12"],
        ["--watch", "nan"],
        ["--window", "99999999999999999999d"],
        ["--window", "101000w"],
        ["--pool", ""],
        ["--colour"],
    ],
)
def test_jobstatus_refuses_bad_flags(args: list[str], capsys: Any) -> None:
    with pytest.raises(CommandError):
        call_command("jobstatus", *args)


def test_jobstatus_reports_an_unreachable_database_in_two_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_jobs.management.commands import jobstatus as command

    def broken(**kwargs: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(command, "snapshot", broken)
    with pytest.raises(CommandError, match=r"Cannot use the jobs database .*: server closed"):
        call_command("jobstatus")


@pytest.mark.django_db(transaction=True)
def test_jobstatus_watch_outlives_a_database_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_jobs.management.commands import jobstatus as command

    populate()
    calls: list[int] = []

    def flaky(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise OperationalError("the database system is shutting down")
        if len(calls) == 4:
            raise KeyboardInterrupt
        return snapshot(**kwargs)

    monkeypatch.setattr(command, "snapshot", flaky)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    out, err = StringIO(), StringIO()
    call_command("jobstatus", "--watch", "--json", stdout=out, stderr=err)
    assert len(out.getvalue().splitlines()) == 2
    assert "cannot read the queue: the database system is shutting down" in err.getvalue()


# --- which pools are listed -------------------------------------------------------------


def listed() -> list[str]:
    return [pool.name for pool in snapshot().pools]


def test_a_mistyped_pool_leaves_the_listings_when_its_worker_stops() -> None:
    # What `runjobworker --pool nosuchpool` writes at start and at its end.
    worker = workers.register_worker("host", 1, ["nosuchpool"], 4)
    assert listed() == ["nosuchpool"]
    workers.stop_worker(worker.pk)
    assert listed() == []
    assert json.loads(jobstatus("--json"))["pools"] == []
    # A worker killed without stopping (its row left running) counts until it is stale.
    WorkerFactory(pools=["nosuchpool"], heartbeat_at=timezone.now() - timedelta(hours=1))
    assert listed() == []


def test_an_idle_pool_stays_listed_while_declared_paused_or_with_runs(settings: Any) -> None:
    for name in ["echo", "nosuchpool", "paused", "resumed", "pending", "finished", "limited"]:
        workers.stop_worker(workers.register_worker("host", 1, [name], 4).pk)
    pause_pool("paused", reason="kept")
    pause_pool("resumed")
    resume_pool("resumed")
    JobRunFactory(pool="pending")
    JobRunFactory(pool="finished", status=Status.COMPLETED, finished_at=timezone.now())
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "TENANT_CONCURRENCY": {"limited": 2}}
    # echo: a @job's pool (tests.echo); limited: named by the settings.
    shot = {pool.name: pool for pool in snapshot().pools}
    assert list(shot) == ["echo", "finished", "limited", "paused", "pending"]
    assert (shot["paused"].paused, shot["paused"].pause_reason) == (True, "kept")
    assert shot["echo"].workers == 0


def test_the_pools_a_project_declares() -> None:
    # The test settings' TASKS backend takes any queue: only Django's default one is known.
    assert {"echo", "default", "ratelimited"} <= declared_pools()
    assert "nosuchpool" not in declared_pools()


def test_the_settings_pools_are_declared_and_bad_names_are_not(settings: Any) -> None:
    settings.DJANGO_JOBS = {
        "RATE_LIMITS": {"mail": "10/s"},
        "TENANT_CONCURRENCY": {"reports": 2, "*": 5},
        "JOB_OPTIONS": {"wagtail.*": {"pool": "wagtail"}, "x.*": {"pool": "a b"}, "y": 3},
    }
    assert {"mail", "reports", "wagtail"} <= declared_pools()
    assert not {"*", "a b"} & declared_pools()
