"""The Completer: completions written in batches, and completions handed off to it.

Handed-off completions (``Completer.hand_off``) are written by the completer
without a caller waiting, so the completer itself must fence, retry and fail
them exactly as a waiting caller would. Completions that share a batch are
fenced each on its own lease, and a bad one costs only its own run.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, connections

from django_jobs import execution, start, start_many
from django_jobs.completer import Completer
from django_jobs.execution import Outcome, execute, record_handed_off
from django_jobs.models import JobRun, Status
from django_jobs.signals import run_completed
from django_jobs.storage import claiming
from django_jobs.storage.claiming import Claim
from django_jobs.storage.leases import complete_many
from django_jobs.storage.notify import raw_connection_params
from tests.factories import WorkerFactory
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(n: int) -> list[Claim]:
    start_many("tests.noop", [{} for _ in range(n)])
    return claiming.claim_batch(WorkerFactory().pk, None, n)


# --- completions written in batches -------------------------------------------------


def test_batched_completion_is_fenced_per_run() -> None:
    start_many("tests.echo", [{"n": n} for n in range(5)])
    batch = claiming.claim_batch(WorkerFactory().pk, None, 5)
    stolen = batch[2]
    JobRun.objects.filter(pk=stolen.run_id).update(lease_token=uuid.uuid4())
    written = complete_many([(claim, {"done": claim.run_id}) for claim in batch])
    assert written == {(c.run_id, c.lease_token) for c in batch if c is not stolen}
    for claim in batch:
        run = JobRun.objects.get(pk=claim.run_id)
        if claim is stolen:
            assert (run.status, run.output) == (Status.RUNNING, None)
        else:
            assert (run.status, run.output, run.lease_token) == (
                Status.COMPLETED,
                {"done": claim.run_id},
                None,
            )


def test_the_completer_answers_each_caller_for_its_own_run() -> None:
    start_many("tests.noop", [{} for _ in range(20)])
    batch = claiming.claim_batch(WorkerFactory().pk, None, 20)
    JobRun.objects.filter(pk=batch[0].run_id).update(status=Status.CANCELED, lease_token=None)
    completer = Completer(record_handed_off)
    results: dict[int, bool] = {}

    def finish(claim: Claim) -> None:
        try:
            results[claim.run_id] = completer.complete(claim, None)
        finally:
            from django.db import connections

            connections.close_all()

    threads = [threading.Thread(target=finish, args=(c,)) for c in batch]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    completer.close()
    assert results[batch[0].run_id] is False
    assert all(results[c.run_id] for c in batch[1:])
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 19
    # After close (a handler that outlived the drain), a completion is written alone.
    start("tests.noop")
    (late,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert completer.complete(late, {"late": True}) is True
    assert JobRun.objects.get(pk=late.run_id).output == {"late": True}


# --- completions handed off ----------------------------------------------------------


def test_a_handed_off_completion_after_a_lease_change_writes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = claimed(3)
    stolen = batch[1]
    # Rescued and claimed again elsewhere: same run, new lease.
    new_token = uuid.uuid4()
    JobRun.objects.filter(pk=stolen.run_id).update(lease_token=new_token)
    completer = Completer(record_handed_off)
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


@pytest.mark.postgresql("kills a session with pg_terminate_backend")
def test_handed_off_completions_are_written_after_their_connection_is_killed() -> None:
    batch = claimed(5)
    written = threading.Event()
    completer = Completer(record_handed_off, after_write=written.set)
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
    completer = Completer(record_handed_off)
    # Handed off together, so they share a batch; the bad one (a lone surrogate,
    # which jsonb refuses) must not cost the other its completion.
    with completer.together():
        completer.hand_off(innocent, None, 0.0)
        completer.hand_off(poisoned, "\ud800", 0.0)
    completer.close()
    assert JobRun.objects.get(pk=innocent.run_id).status == Status.COMPLETED
    failed = JobRun.objects.get(pk=poisoned.run_id)
    assert failed.status == Status.FAILED
    assert failed.output is None
    # PostgreSQL names the bad text; MariaDB's JSON check refuses the row.
    refusal = "CONSTRAINT" if connection.vendor == "mysql" else "nicode"
    assert refusal in failed.error["message"]


def test_with_a_run_completed_receiver_the_completion_is_written_before_it_is_called() -> None:
    (claim,) = claimed(1)
    seen: list[str] = []

    def receiver(sender: Any, run_id: int, **kwargs: Any) -> None:
        seen.append(JobRun.objects.get(pk=run_id).status)

    completer = Completer(record_handed_off)
    run_completed.connect(receiver)
    try:
        outcome = execute(claim, completer=completer)
    finally:
        run_completed.disconnect(receiver)
        completer.close()
    assert outcome is Outcome.COMPLETED
    assert seen == [Status.COMPLETED]


def test_without_receivers_a_parentless_completion_is_handed_off() -> None:
    (claim,) = claimed(1)
    completer = Completer(record_handed_off)
    try:
        assert execute(claim, completer=completer) is Outcome.HANDED_OFF
    finally:
        completer.close()
    assert JobRun.objects.get(pk=claim.run_id).status == Status.COMPLETED


# --- completions sharing a batch -----------------------------------------------------


def _claim(job_type: str = "tests.noop") -> Claim:
    start(job_type)
    (claim,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    return claim


class SameBatch:
    """Make every completion started inside the block land in one Completer batch.

    A first completion is held on a row lock taken by another connection, so the
    Completer's write blocks; the completions that gather meanwhile are written
    together once the lock is released.
    """

    def __init__(self, completer: Completer) -> None:
        self.completer = completer
        self.blocker = _claim()
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> SameBatch:
        self.lock = psycopg.connect(**raw_connection_params())
        self.lock.execute(
            "SELECT 1 FROM django_jobs_jobrun WHERE id = %s FOR UPDATE", [self.blocker.run_id]
        )
        try:
            self.spawn(self.completer.complete, self.blocker, None)
            wait_until(self._writer_blocked, timeout=10)
        except BaseException:
            self.lock.close()
            raise
        return self

    def _writer_blocked(self) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' "
                "AND query LIKE '%%UPDATE \"django_jobs_jobrun\" AS run%%'"
            )
            return bool(cursor.fetchone()[0])

    def spawn(self, fn: Any, *args: Any) -> None:
        def target() -> None:
            try:
                fn(*args)
            finally:
                connections.close_all()

        thread = threading.Thread(target=target)
        thread.start()
        self.threads.append(thread)

    def __exit__(self, *exc: Any) -> None:
        expected = len(self.threads) - 1
        try:
            wait_until(lambda: self.completer.waiting == expected, timeout=10)
        finally:
            self.lock.rollback()
            self.lock.close()
        for thread in self.threads:
            thread.join(20)


@pytest.mark.postgresql("completions batched in one statement")
@pytest.mark.django_db(transaction=True)
def test_one_unstorable_output_does_not_fail_the_other_runs_of_its_batch() -> None:
    innocent = _claim("tests.noop")
    poisoned = _claim("tests.noop")
    completer = Completer(record_handed_off)
    outcomes: dict[int, Any] = {}

    def poison(claim: Claim) -> None:
        # A value jsonb refuses (a lone surrogate); whatever slips past normalize()
        # must cost only its own run.
        try:
            outcomes[claim.run_id] = completer.complete(claim, "\ud800")
        except DatabaseError as exc:
            outcomes[claim.run_id] = exc

    try:
        with SameBatch(completer) as batch:
            batch.spawn(
                lambda c: outcomes.__setitem__(
                    c.run_id,
                    execution.record(
                        c, execution.Decision(Outcome.COMPLETED, output=None), completer=completer
                    ),
                ),
                innocent,
            )
            batch.spawn(poison, poisoned)
    finally:
        completer.close()
    assert isinstance(outcomes[poisoned.run_id], DatabaseError)
    # The innocent run returned None; it must not pay for its neighbour's output.
    innocent_run = JobRun.objects.get(pk=innocent.run_id)
    assert (innocent_run.status, innocent_run.error) == (Status.COMPLETED, None)
    assert outcomes[innocent.run_id] == Outcome.COMPLETED


@pytest.mark.postgresql("completions batched in one statement")
@pytest.mark.django_db(transaction=True)
def test_a_stale_lease_in_a_batch_gets_false_even_when_the_new_lease_of_that_run_wins() -> None:
    # A run fenced off while its handler still runs can be claimed again by the same
    # worker (worker.py keys in-flight runs by context for this reason); both
    # handlers may then finish in one batch.
    stale = _claim()
    JobRun.objects.filter(pk=stale.run_id).update(status=Status.PENDING, lease_token=None)
    (fresh,) = claiming.claim_batch(WorkerFactory().pk, None, 1)
    assert fresh.run_id == stale.run_id
    assert fresh.lease_token != stale.lease_token
    completer = Completer(record_handed_off)
    results: dict[uuid.UUID, bool] = {}
    try:
        with SameBatch(completer) as batch:
            for claim in (stale, fresh):
                batch.spawn(
                    lambda c: results.__setitem__(
                        c.lease_token, completer.complete(c, {"token": str(c.lease_token)})
                    ),
                    claim,
                )
    finally:
        completer.close()
    assert JobRun.objects.get(pk=fresh.run_id).output == {"token": str(fresh.lease_token)}
    assert results[fresh.lease_token] is True
    assert results[stale.lease_token] is False  # its write was fenced off
