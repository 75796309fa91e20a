"""Retention in the worker: ``DJANGO_JOBS["RETENTION"]``, the ``Pruner``'s bounded passes,
and the worker that starts it (or not)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, connections
from django.test import override_settings
from django.utils import timezone

from django_jobs import conf, retention
from django_jobs.models import JobEvent, JobRun, JobStep, Status
from django_jobs.retention import Pruner, describe_age
from django_jobs.storage.control import ControlConnection
from django_jobs.testing import drain
from django_jobs.worker import JobWorker
from tests.factories import JobRunFactory, JobStepFactory
from tests.helpers import wait_until

OLD = timezone.now() - timedelta(days=40)
DAY = 86_400.0


def finished(status: str = Status.COMPLETED, *, at: Any = OLD, **fields: Any) -> JobRun:
    run: JobRun = JobRunFactory(status=status, finished_at=at, **fields)
    return run


def child_of(parent: JobRun, status: str = Status.COMPLETED, **fields: Any) -> JobRun:
    fields.setdefault("at", OLD if status in {Status.COMPLETED, Status.FAILED} else None)
    return finished(status, parent=parent, root=parent.root or parent, **fields)


def alive() -> set[int]:
    return set(JobRun.objects.values_list("pk", flat=True))


def roots() -> list[int]:
    return list(
        JobRun.objects.filter(parent__isnull=True).order_by("pk").values_list("pk", flat=True)
    )


def pruner(stop: threading.Event | None = None) -> Pruner:
    return Pruner(30 * DAY, stop or threading.Event())


@pytest.fixture
def small_passes(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, int], None]:
    def set_budget(batch_size: int, batches: int) -> None:
        monkeypatch.setattr(retention, "BATCH_SIZE", batch_size)
        monkeypatch.setattr(retention, "PASS_BATCHES", batches)

    return set_budget


# --- the setting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (timedelta(days=30), 30 * DAY),
        (None, None),
        (60, 60.0),
        (timedelta(days=36_500), 36_500 * DAY),
    ],
)
def test_retention_accepts_a_minute_to_a_century_or_none(value: Any, seconds: Any) -> None:
    with override_settings(DJANGO_JOBS={"RETENTION": value}):
        assert conf.problems() == []
        assert seconds == conf.get().RETENTION


def test_retention_defaults_to_thirty_days() -> None:
    with override_settings(DJANGO_JOBS={}):
        assert conf.get().RETENTION == 30 * DAY


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (59, "RETENTION must be from a minute to 100 years (or None), got 59"),
        (0, "RETENTION must be from a minute to 100 years (or None), got 0"),
        (-DAY, "RETENTION must be from a minute to 100 years (or None), got -86400.0"),
        (math.inf, "RETENTION must be from a minute to 100 years (or None), got inf"),
        (math.nan, "RETENTION must be from a minute to 100 years (or None), got nan"),
        (timedelta(days=36_501), "RETENTION must be from a minute to 100 years (or None)"),
        ("30d", "RETENTION must be seconds, a timedelta or None, got '30d'"),
        (True, "RETENTION must be seconds, a timedelta or None, got True"),
    ],
)
def test_a_bad_retention_is_reported_and_keeps_every_run(value: Any, problem: str) -> None:
    with override_settings(DJANGO_JOBS={"RETENTION": value}):
        assert [p for p in conf.problems() if p.startswith(problem)] != []
        assert conf.get().RETENTION is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30 * DAY, "30d"), (14 * DAY, "2w"), (7200.0, "2h"), (90.0, "90s"), (None, "off")],
)
def test_the_retention_as_logged(seconds: float | None, text: str) -> None:
    assert describe_age(seconds) == text


def test_passes_are_spread_around_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    for draw, factor in ((0.0, 0.5), (0.5, 1.0), (0.999, 1.499)):
        monkeypatch.setattr(retention.random, "random", lambda draw=draw: draw)
        assert Pruner.pause(more=False) == pytest.approx(300.0 * factor)
        # After a pass that left more to do, the next comes soon.
        assert Pruner.pause(more=True) == pytest.approx(5.0 * factor)
    monkeypatch.setattr(retention, "INTERVAL", 0.2)
    assert Pruner.pause(more=True) == pytest.approx(0.2 * 1.499)


# --- a pass ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_pass_deletes_old_families_and_keeps_what_is_still_needed() -> None:
    old = finished()
    JobStepFactory(run=old)
    JobEvent.objects.create(run=old, name="late", payload=None)
    old_child = child_of(old, Status.FAILED)
    JobStepFactory(run=old_child)
    recent = finished(at=timezone.now() - timedelta(days=2))
    # A waiting parent: its old finished child is what its replay reads.
    waiting = JobRunFactory(status=Status.WAITING)
    done_child = child_of(waiting)
    open_child = child_of(waiting, Status.PENDING)
    # A finished top-level run with an abandoned child still running.
    abandoning = finished()
    abandoned = child_of(abandoning, Status.RUNNING)
    pending = JobRunFactory(created_at=OLD)
    more = pruner().step()
    assert more is False
    assert alive() == {
        recent.pk,
        waiting.pk,
        done_child.pk,
        open_child.pk,
        abandoning.pk,
        abandoned.pk,
        pending.pk,
    }
    assert not JobStep.objects.filter(run_id__in=[old.pk, old_child.pk]).exists()
    assert not JobEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_pass_is_bounded_and_the_next_goes_on_from_there(
    small_passes: Callable[[int, int], None],
) -> None:
    small_passes(2, 2)
    runs = [finished() for _ in range(7)]
    for run in runs:
        child_of(run)
    worker = pruner()
    assert worker.step() is True  # its budget ran out: 2 batches of 2 families
    assert roots() == [run.pk for run in runs[4:]]
    assert JobRun.objects.count() == 3 * 2
    # 2 families and the last one: the budget is spent, the walk's end not seen yet.
    assert worker.step() is True
    assert roots() == []
    assert worker.step() is False  # the walk's end
    assert worker.cursor == 0
    assert JobRun.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_families_kept_are_passed_over_not_read_at_every_pass(
    small_passes: Callable[[int, int], None],
) -> None:
    small_passes(1, 2)
    kept = [finished() for _ in range(3)]
    for run in kept:
        child_of(run, Status.WAITING)
    doomed = finished()
    worker = pruner()
    assert worker.step() is True  # read the first two kept families
    assert doomed.pk in alive()
    worker.step()  # the third kept family, then the doomed one
    assert doomed.pk not in alive()
    assert {run.pk for run in kept} <= alive()


@pytest.mark.django_db(transaction=True)
def test_the_walk_starts_again_from_the_first_id_after_its_end() -> None:
    first = finished(at=timezone.now())
    later = finished()
    worker = pruner()
    assert worker.step() is False
    assert alive() == {first.pk}
    # The walk went past it; aged since, it goes at the walk after.
    JobRun.objects.filter(pk=first.pk).update(finished_at=OLD)
    worker.step()
    assert alive() == set()
    assert later.pk not in alive()


@pytest.mark.django_db(transaction=True)
def test_a_database_error_is_logged_and_the_next_pass_tries_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run = finished()
    real = retention.prune_batch
    calls = 0

    def fails_once(*args: Any, **kwargs: Any) -> int | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OperationalError("the server went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(retention, "prune_batch", fails_once)
    worker = pruner()
    with caplog.at_level(logging.WARNING, logger="django_jobs.retention"):
        assert worker.step() is False
    assert "retention database error: the server went away" in caplog.text
    assert run.pk in alive()
    worker.step()
    assert run.pk not in alive()


@pytest.mark.django_db(transaction=True)
def test_between_batches_a_thread_waiting_for_the_control_connection_takes_it(
    monkeypatch: pytest.MonkeyPatch, small_passes: Callable[[int, int], None]
) -> None:
    small_passes(1, 3)
    for _ in range(3):
        finished()
    control = ControlConnection(connection.alias)
    order: list[str] = []
    real = retention.prune_batch

    def other() -> None:
        with control:
            order.append("other")

    waiter = threading.Thread(target=other)

    def batch(*args: Any, **kwargs: Any) -> int | None:
        order.append("batch")
        if len(order) == 1:
            waiter.start()  # it waits for this batch's end
            time.sleep(1)  # so the pause after it is as long: ample for the waiter
        return real(*args, **kwargs)

    monkeypatch.setattr(retention, "prune_batch", batch)
    try:
        assert Pruner(30 * DAY, threading.Event(), control=control).step() is True
        waiter.join(10)
    finally:
        control.release()
    assert order == ["batch", "other", "batch", "batch"]
    assert JobRun.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_stopped_pruner_deletes_nothing_more(small_passes: Callable[[int, int], None]) -> None:
    small_passes(1, 10)
    runs = [finished() for _ in range(3)]
    stop = threading.Event()
    stop.set()
    assert Pruner(30 * DAY, stop).step() is False
    assert alive() == {run.pk for run in runs}


@pytest.mark.django_db(transaction=True)
def test_drain_prunes_nothing() -> None:
    run = finished()
    JobRunFactory()
    drain()
    assert run.pk in alive()


# --- in the worker --------------------------------------------------------------------


@pytest.fixture
def running_worker() -> Iterator[Callable[[], JobWorker]]:
    """Run a JobWorker on a thread; it is stopped (and joined) at teardown."""
    started: list[tuple[JobWorker, threading.Thread]] = []

    def start() -> JobWorker:
        worker = JobWorker(["default"], concurrency=1, poll_interval=0.05)

        def work() -> None:
            try:
                worker.run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=work)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.request_stop()
        thread.join(30)
        assert not thread.is_alive()


def pruning_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "django-jobs-retention"]


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_prunes_while_it_runs_runs(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    running_worker: Callable[[], JobWorker],
) -> None:
    monkeypatch.setattr(retention, "INTERVAL", 0.1)
    # A parent waiting for two children, one finished long ago, one pending in a
    # pool no worker serves here.
    waiting = JobRunFactory(status=Status.WAITING, job_type="tests.parent")
    kept = child_of(waiting)
    other = child_of(waiting, Status.PENDING, pool="elsewhere")
    JobRun.objects.filter(pk=waiting.pk).update(awaiting=[kept.pk, other.pk])
    old = [finished() for _ in range(3)]
    with caplog.at_level(logging.INFO, logger="django_jobs"):
        running_worker()
        wait_until(lambda: not JobRun.objects.filter(pk__in=[r.pk for r in old]).exists())
        run = JobRunFactory(job_type="tests.record")
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED)
        # Logged at the pass's end, after its last batch.
        wait_until(lambda: "retention deleted" in caplog.text)
    assert alive() == {waiting.pk, kept.pk, other.pk, run.pk}
    assert " retention=30d" in caplog.text
    assert "retention deleted runs=3 steps=0 kept_open=0 older_than=30d" in caplog.text
    assert len(pruning_threads()) == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_without_retention_starts_no_pruner(
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    running_worker: Callable[[], JobWorker],
) -> None:
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "RETENTION": None}
    monkeypatch.setattr(retention, "INTERVAL", 0.01)
    old = finished()
    assert JobWorker(["default"]).start_pruner() is None
    with caplog.at_level(logging.INFO, logger="django_jobs"):
        worker = running_worker()
        run = JobRunFactory(job_type="tests.record")
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED)
    assert worker.retention is None
    assert " retention=off" in caplog.text
    assert pruning_threads() == []
    assert old.pk in alive()


@pytest.mark.django_db(transaction=True)
def test_the_pruner_stops_with_the_worker(
    monkeypatch: pytest.MonkeyPatch, running_worker: Callable[[], JobWorker]
) -> None:
    monkeypatch.setattr(retention, "INTERVAL", 3600.0)
    worker = running_worker()
    wait_until(lambda: len(pruning_threads()) == 1)
    worker.request_stop()
    wait_until(lambda: pruning_threads() == [])
