"""The fast paths keep the guarantees: handed-off completions, prepared claims, polling.

Handed-off completions (``Completer.hand_off``) are written by the completer
without a caller waiting, so the completer itself must fence, retry and fail
them exactly as a waiting caller would.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest
from django.db import connection, connections

from django_jobs import claims, notify, start, start_many
from django_jobs.batching import Completer
from django_jobs.execution import Outcome, execute
from django_jobs.models import JobRun, Status
from django_jobs.signals import run_completed
from django_jobs.worker import Worker
from tests.factories import WorkerFactory
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(n: int) -> list[claims.Claim]:
    start_many("tests.noop", [{} for _ in range(n)])
    return claims.claim_batch(WorkerFactory().pk, None, n)


def test_a_handed_off_completion_after_a_lease_change_writes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = claimed(3)
    stolen = batch[1]
    # Rescued and claimed again elsewhere: same run, new lease.
    new_token = uuid.uuid4()
    JobRun.objects.filter(pk=stolen.run_id).update(lease_token=new_token)
    completer = Completer()
    with caplog.at_level(logging.INFO, logger="django_jobs.execution"):
        for claim in batch:
            assert completer.hand_off(claim, {"by": "old lease"}, 0.0) is None
        completer.close()
    runs = {run.pk: run for run in JobRun.objects.all()}
    assert (runs[stolen.run_id].status, runs[stolen.run_id].lease_token) == (
        Status.RUNNING,
        new_token,
    )
    assert runs[stolen.run_id].output is None
    for claim in (batch[0], batch[2]):
        assert (runs[claim.run_id].status, runs[claim.run_id].output) == (
            Status.COMPLETED,
            {"by": "old lease"},
        )
    assert f"run={stolen.run_id} type=tests.noop outcome=lost" in caplog.text


def test_handed_off_completions_are_written_after_their_connection_is_killed() -> None:
    batch = claimed(5)
    written = threading.Event()
    completer = Completer(after_write=written.set)
    try:
        completer.hand_off(batch[0], None, 0.0)
        assert written.wait(10)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE '%%jsonb_to_recordset%%'"
            )
            assert cursor.fetchone() is not None
        for claim in batch[1:]:
            completer.hand_off(claim, None, 0.0)
        wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == 5, timeout=20)
    finally:
        completer.close()


def test_a_handed_off_output_the_database_refuses_fails_only_its_run() -> None:
    innocent, poisoned = claimed(2)
    completer = Completer()
    # Handed off together, so they share a batch; the bad one (a lone surrogate,
    # which jsonb refuses) must not cost the other its completion.
    with completer._lock:
        completer.hand_off(innocent, None, 0.0)
        completer.hand_off(poisoned, "\ud800", 0.0)
    completer.close()
    assert JobRun.objects.get(pk=innocent.run_id).status == Status.COMPLETED
    failed = JobRun.objects.get(pk=poisoned.run_id)
    assert failed.status == Status.FAILED
    assert failed.output is None
    assert "Unicode" in failed.error["message"] or "unicode" in failed.error["message"]


def test_with_a_run_completed_receiver_the_completion_is_written_before_it_is_called() -> None:
    (claim,) = claimed(1)
    seen: list[str] = []

    def receiver(sender: Any, run_id: int, **kwargs: Any) -> None:
        seen.append(JobRun.objects.get(pk=run_id).status)

    completer = Completer()
    run_completed.connect(receiver)
    try:
        outcome = execute(claim, complete=completer.complete, hand_off=completer.hand_off)
    finally:
        run_completed.disconnect(receiver)
        completer.close()
    assert outcome is Outcome.COMPLETED
    assert seen == [Status.COMPLETED]


def test_without_receivers_a_parentless_completion_is_handed_off() -> None:
    (claim,) = claimed(1)
    completer = Completer()
    try:
        assert execute(claim, hand_off=completer.hand_off) is Outcome.QUEUED
    finally:
        completer.close()
    assert JobRun.objects.get(pk=claim.run_id).status == Status.COMPLETED


def test_the_claim_is_planned_once_per_connection() -> None:
    start_many("tests.noop", [{} for _ in range(12)])
    worker = WorkerFactory().pk
    for _ in range(12):
        assert len(claims.claim_batch(worker, ["default"], 1)) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%FOR UPDATE SKIP LOCKED%%'"
        )
        ((generic, custom),) = cursor.fetchall()
    # The server plans custom five times, then keeps the cached generic plan.
    assert generic >= 6
    assert custom <= 5


def test_a_notification_lost_while_the_listener_is_down_is_covered_by_polling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = Worker(["default"], poll_interval=0.5)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: listeners() == 1, timeout=10)
        # From now on the listener cannot reconnect: every notification is lost.
        real = notify.raw_connection_params
        monkeypatch.setattr(notify, "raw_connection_params", lambda: {**real(), "port": 1})
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %%' "
                "AND pid <> pg_backend_pid()"
            )
        wait_until(lambda: listeners() == 0, timeout=10)
        run = start("tests.noop")
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED, timeout=20)
        assert listeners() == 0
    finally:
        worker.request_stop()
        thread.join(30)
        connections.close_all()


def listeners() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%' "
            "AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_the_worker_plans_its_claim_afresh_when_runs_come_after_an_idle_spell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A generic plan made while the table was empty stays in use until the next
    # ANALYZE; a burst of runs must be claimed with a plan made for it.
    seen: list[tuple[int, int]] = []
    real = claims.claim_batch

    def recording(*args: Any, plan: int = 0) -> list[claims.Claim]:
        batch = real(*args, plan=plan)
        seen.append((plan, len(batch)))
        return batch

    monkeypatch.setattr(claims, "claim_batch", recording)
    worker = Worker(["default"], concurrency=4, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: len(seen) >= 3, timeout=10)  # idle claims
        start_many("tests.noop", [{} for _ in range(20)])
        wait_until(lambda: JobRun.objects.filter(status=Status.COMPLETED).count() == 20)
    finally:
        worker.request_stop()
        thread.join(30)
        connections.close_all()
    first_busy = next(i for i, (_, size) in enumerate(seen) if size)
    idle_plan = seen[first_busy][0]
    assert all(plan == idle_plan for plan, _ in seen[:first_busy])
    assert seen[first_busy + 1][0] == idle_plan + 1
