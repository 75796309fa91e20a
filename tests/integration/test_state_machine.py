"""Property test of the run state machine (hypothesis).

Random sequences of start, claim (by two workers), complete, fail, retry
scheduled, cancel, manual retry, rescue, release, durable sleep and time
passing, against the real database. After every operation: only legal
transitions happened, no run was lost, a lease token exists exactly on running
runs, no run has two owners (of all the claims ever handed out, at most one
still matches a run's lease), and each counted attempt has its worker recorded.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobs import cancel, claims, lifecycle, retry, start
from django_jobs.exceptions import InvalidTransition
from django_jobs.models import JobRun, JobStep, Status, Worker

pytestmark = pytest.mark.django_db(transaction=True)

S = Status
ALLOWED = {
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.CANCELED),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.PENDING),  # retry scheduled, rescue, release
    (S.RUNNING, S.CANCELED),
    (S.RUNNING, S.TIMED_OUT),
    (S.RUNNING, S.WAITING),
    (S.WAITING, S.PENDING),
    (S.WAITING, S.CANCELED),
    (S.FAILED, S.PENDING),
    (S.TIMED_OUT, S.PENDING),
    (S.CANCELED, S.PENDING),
}
ERROR = {"type": "tests.Boom", "message": "boom", "traceback": "", "attempt": 1}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 0)),
        st.tuples(st.just("claim"), st.integers(0, 1)),
        st.tuples(st.just("complete"), st.integers(0, 50)),
        st.tuples(st.just("fail"), st.integers(0, 50)),
        st.tuples(st.just("reschedule"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("retry"), st.integers(0, 50)),
        st.tuples(st.just("rescue"), st.integers(0, 1)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("sleep"), st.integers(0, 50)),
        st.tuples(st.just("time passes"), st.integers(0, 0)),
    ),
    min_size=1,
    max_size=30,
)


class Model:
    """What the test knows: the runs it started, and every claim ever handed out."""

    def __init__(self) -> None:
        self.workers = [claims.register_worker("w", n, None, 4).pk for n in (1, 2)]
        self.runs: list[int] = []
        self.held: list[claims.Claim] = []
        self.holder: dict[Any, Any] = {}  # lease token -> the worker that claimed it
        self.last: dict[int, str] = {}

    def pick(self, items: list[Any], index: int) -> Any:
        return items[index % len(items)] if items else None

    def apply(self, name: str, arg: int) -> None:
        if name == "start":
            self.runs.append(start("tests.flaky", {"succeed_on": 99}).pk)
        elif name == "claim":
            batch = claims.claim_batch(self.workers[arg], None, 2)
            self.held += batch
            self.holder.update({claim.lease_token: self.workers[arg] for claim in batch})
        elif name in ("release", "sleep"):
            claim = self.pick(self.held, arg)
            if claim is None:
                return
            run = JobRun.objects.get(pk=claim.run_id)
            holds = run.lease_token == claim.lease_token
            if name == "release":
                wrote = claims.release(self.holder[claim.lease_token], [claim]) == 1
                assert wrote == holds
            else:
                until = timezone.now() + timedelta(hours=1)
                outcome = lifecycle.suspend_until(claim, until)
                # A run asked to cancel does not suspend: it must end now.
                asked = run.cancel_requested_at is not None
                assert (outcome == lifecycle.SUSPENDED) == (holds and not asked)
        elif name in ("complete", "fail", "reschedule"):
            claim = self.pick(self.held, arg)
            if claim is None:
                return
            current = JobRun.objects.get(pk=claim.run_id).lease_token
            if name == "complete":
                wrote = claims.complete(claim, {"ok": True})
            elif name == "fail":
                wrote = claims.fail(claim, ERROR)
            else:
                wrote = claims.reschedule(claim, ERROR, 3600)
            # A write lands exactly when the claim still holds the lease.
            assert wrote == (current == claim.lease_token)
        elif name == "cancel":
            run_id = self.pick(self.runs, arg)
            if run_id is not None:
                cancel(run_id)
        elif name == "retry":
            run_id = self.pick(self.runs, arg)
            if run_id is not None:
                try:
                    retry(run_id)
                except InvalidTransition:
                    assert self.last[run_id] not in (S.FAILED, S.TIMED_OUT, S.CANCELED)
        elif name == "rescue":
            stale = self.workers[arg]
            Worker.objects.filter(pk=stale).update(heartbeat_at=timezone.now() - timedelta(hours=1))
            claims.rescue_stale(None, 60)
            Worker.objects.filter(pk=stale).update(heartbeat_at=timezone.now(), status="running")
        elif name == "time passes":
            JobRun.objects.filter(status__in=[S.PENDING, S.WAITING]).update(run_at=timezone.now())
            lifecycle.wake_sleepers()

    def check(self) -> None:
        rows = {run.pk: run for run in JobRun.objects.all()}
        assert sorted(rows) == sorted(self.runs), "a run was lost or appeared"
        for run_id, run in rows.items():
            before = self.last.get(run_id, S.PENDING)
            assert run.status == before or (before, run.status) in ALLOWED, (before, run.status)
            self.last[run_id] = run.status
            assert (run.status == S.RUNNING) == (run.lease_token is not None)
            # One recorded worker per counted attempt, the holder last.
            assert len(run.worker_ids) == run.attempts, (run.worker_ids, run.attempts)
            if run.status == S.RUNNING:
                assert run.claimed_by_id in self.workers
                assert run.attempts >= 1
                assert run.worker_ids[-1] == str(run.claimed_by_id)
            owners = [
                c for c in self.held if c.run_id == run_id and c.lease_token == run.lease_token
            ]
            assert len(owners) <= 1, "two claims hold one run"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations)
def test_random_operations_keep_the_state_machine_sound(ops: list[tuple[str, int]]) -> None:
    JobStep.objects.all().delete()
    JobRun.objects.all().delete()
    Worker.objects.all().delete()
    model = Model()
    model.apply("start", 0)
    model.check()
    for name, arg in ops:
        model.apply(name, arg)
        model.check()
