"""Failures and retries reach the log (WARNING / ERROR, with exc_info) and the signals."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_jobs import start, transitions
from django_jobs.exceptions import WorkerLost
from django_jobs.execution import execute
from django_jobs.models import JobRun, Status
from django_jobs.signals import run_failed, run_retry_scheduled
from django_jobs.storage import claiming
from tests.factories import RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    def on_failed(sender: Any, **kwargs: Any) -> None:
        calls.append(("failed", kwargs))

    def on_retry(sender: Any, **kwargs: Any) -> None:
        calls.append(("retry", kwargs))

    run_failed.connect(on_failed, weak=False)
    run_retry_scheduled.connect(on_retry, weak=False)
    yield calls
    run_failed.disconnect(on_failed)
    run_retry_scheduled.disconnect(on_retry)


def run_once(job_type: str) -> JobRun:
    run = start(job_type)
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    execute(claim)
    run.refresh_from_db()
    return run


def outcome_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django_jobs.execution"]


def test_a_retry_is_a_warning_with_the_exception_and_the_next_attempt(
    caplog: pytest.LogCaptureFixture, received: list[tuple[str, dict[str, Any]]]
) -> None:
    # At -v 0 the worker logs WARNING and above: the retry must show there.
    caplog.set_level(logging.WARNING, logger="django_jobs")
    before = timezone.now()
    run = run_once("tests.backoff")  # RuntimeError("try again in an hour"), base_delay=3600
    assert run.status == Status.PENDING
    (record,) = outcome_records(caplog)
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert f"run={run.pk} type=tests.backoff outcome=retry attempt=1" in message
    assert "error=builtins.RuntimeError message='try again in an hour'" in message
    next_attempt = datetime.fromisoformat(message.rsplit("next_attempt=", 1)[1])
    assert before + timedelta(minutes=59) <= next_attempt <= timezone.now() + timedelta(hours=1)
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError
    assert str(record.exc_info[1]) == "try again in an hour"
    assert record.exc_info[2] is not None  # the handler's traceback, for error trackers
    ((name, kwargs),) = received
    assert name == "retry"
    assert kwargs["run_id"] == run.pk
    assert kwargs["attempt"] == 1
    assert kwargs["exception"] is record.exc_info[1]


def test_a_final_failure_is_an_error_with_the_exception(
    caplog: pytest.LogCaptureFixture, received: list[tuple[str, dict[str, Any]]]
) -> None:
    caplog.set_level(logging.WARNING, logger="django_jobs")
    run = run_once("tests.permanent")
    assert run.status == Status.FAILED
    (record,) = outcome_records(caplog)
    assert record.levelno == logging.ERROR
    assert f"run={run.pk} type=tests.permanent outcome=failed attempt=1" in record.getMessage()
    assert f"error={run.error['type']} " in record.getMessage()
    assert "next_attempt=none" in record.getMessage()
    assert record.exc_info is not None
    assert (
        f"{record.exc_info[0].__module__}.{record.exc_info[0].__qualname__}" == (run.error["type"])
    )
    ((name, kwargs),) = received
    assert name == "failed"
    assert kwargs["exception"] is record.exc_info[1]


def test_a_completed_run_stays_an_info_line(
    caplog: pytest.LogCaptureFixture, received: list[tuple[str, dict[str, Any]]]
) -> None:
    caplog.set_level(logging.INFO, logger="django_jobs")
    run_once("tests.noop")
    (record,) = outcome_records(caplog)
    assert (record.levelno, record.exc_info) == (logging.INFO, None)
    assert received == []


def test_a_run_failed_by_the_rescue_sweep_carries_worker_lost(
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    dead = WorkerFactory(heartbeat_at=timezone.now() - timedelta(hours=1))
    run = RunningJobRunFactory(claimed_by=dead, max_attempts=1)
    assert transitions.rescue_stale(None, stale_after=60) == (0, 1)
    ((name, kwargs),) = received
    assert (name, kwargs["run_id"]) == ("failed", run.pk)
    assert isinstance(kwargs["exception"], WorkerLost)
