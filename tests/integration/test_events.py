"""Events into runs (send_event, ctx.wait_for_event) run in this process by drain()."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobs import cancel, retry, send_event, start, start_many
from django_jobs.exceptions import InvalidJobInput, InvalidTransition, RunNotFound
from django_jobs.models import NO_DEADLINE, JobEvent, JobRun, JobStep, Status
from django_jobs.testing import drain
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def fresh(run: JobRun) -> JobRun:
    return JobRun.objects.get(pk=run.pk)


@pytest.mark.parametrize("job_type", ["tests.approval", "tests.async_approval"])
def test_a_run_waits_without_a_slot_until_its_event_then_returns_the_payload(
    job_type: str,
) -> None:
    run = start(job_type)
    assert drain() == 1
    waiting = fresh(run)
    assert (waiting.status, waiting.awaiting_event) == (Status.WAITING, "approved")
    assert waiting.run_at == NO_DEADLINE
    assert waiting.claimed_by_id is None
    send_event(run, "approved", {"by": "ann"})
    assert fresh(run).status == Status.PENDING
    assert drain() == 1
    done = fresh(run)
    assert (done.status, done.output) == (Status.COMPLETED, [{"by": "ann"}])
    event = JobEvent.objects.get(run=run)
    assert event.consumed_at is not None
    assert event.consumed_by == "event:approved"


def test_events_sent_before_the_wait_are_kept_in_order_each_taken_once() -> None:
    run = start("tests.approval", {"count": 2})
    send_event(run.pk, "approved", 1)
    send_event(run.pk, "other", "not this one")
    send_event(run.pk, "approved", 2)
    send_event(run.pk, "approved", 3)
    assert drain() == 1
    assert fresh(run).output == [1, 2]
    left = JobEvent.objects.filter(run=run, consumed_at__isnull=True)
    assert sorted(left.values_list("name", "payload")) == [
        ("approved", 3),
        ("other", "not this one"),
    ]


def test_a_retry_replays_the_taken_payload_and_takes_no_other() -> None:
    run = start("tests.approval", {"fail_once": True})
    send_event(run, "approved", "first")
    send_event(run, "approved", "second")
    assert drain() == 2  # the first attempt fails after its event, the second replays it
    done = fresh(run)
    assert (done.status, done.attempts, done.output) == (Status.COMPLETED, 2, ["first"])
    assert JobEvent.objects.filter(run=run, consumed_at__isnull=True).get().payload == "second"


def test_an_event_sent_in_a_rolled_back_transaction_never_arrives() -> None:
    run = start("tests.approval")
    drain()

    def send_then_fail() -> None:
        with transaction.atomic():
            send_event(run, "approved", "never")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        send_then_fail()
    assert not JobEvent.objects.exists()
    assert fresh(run).status == Status.WAITING


def test_the_timeout_returns_the_default_or_raises() -> None:
    with_default = start("tests.approval", {"timeout": 60, "default": "none came"})
    without = start("tests.approval", {"timeout": 60})
    drain()
    # Their deadlines passed (moved as the clock would).
    JobRun.objects.filter(pk__in=[with_default.pk, without.pk]).update(
        run_at=timezone.now() - timedelta(seconds=1)
    )
    JobStep.objects.filter(step_id="event-deadline:approved").update(
        output={"until": (timezone.now() - timedelta(seconds=1)).isoformat()}
    )
    drain()
    assert fresh(with_default).output == ["none came"]
    failed = fresh(without)
    assert failed.status == Status.FAILED
    assert failed.error["type"] == "django_jobs.exceptions.EventTimeout"
    # An event sent after the deadline is not taken by the timed-out wait.
    assert JobStep.objects.filter(run=with_default, step_id="event:approved").get().output == {
        "timed_out": True
    }


def test_an_event_sent_after_the_deadline_is_not_taken_on_replay() -> None:
    run = start("tests.approval", {"timeout": 60, "default": "late"})
    drain()
    past = timezone.now() - timedelta(seconds=1)
    JobStep.objects.filter(run=run, step_id="event-deadline:approved").update(
        output={"until": past.isoformat()}
    )
    send_event(run, "approved", "too late")  # wakes it, but after its deadline
    drain()
    assert fresh(run).output == ["late"]
    assert JobEvent.objects.get(run=run).consumed_at is None


def test_a_cancel_ends_the_wait_at_once() -> None:
    run = start("tests.approval")
    drain()
    assert cancel(run.pk) == 1
    assert fresh(run).status == Status.CANCELED


def test_sending_to_a_finished_or_missing_or_other_tenants_run_stores_nothing() -> None:
    done = start("tests.noop")
    drain()
    with pytest.raises(InvalidTransition, match="has finished"):
        send_event(done, "approved")
    with pytest.raises(RunNotFound):
        send_event(10**12, "approved")
    theirs = start("tests.approval", tenant_id="b")
    with pytest.raises(RunNotFound):
        send_event(theirs, "approved", tenant_id="a")
    send_event(theirs, "approved", "ok", tenant_id="b")
    assert list(JobEvent.objects.values_list("run_id", flat=True)) == [theirs.pk]


@pytest.mark.parametrize(
    ("name", "payload"),
    [("", None), ("a b", None), ("x" * 201, None), ("a#b", None), (3, None), ("ok", {1, 2})],
)
def test_bad_names_and_payloads_are_refused(name: object, payload: object) -> None:
    run = start("tests.approval")
    with pytest.raises((ValueError, InvalidJobInput)):
        send_event(run, name, payload)  # type: ignore[arg-type]
    assert not JobEvent.objects.exists()


def test_a_retry_that_resets_steps_takes_the_events_again() -> None:
    run = start("tests.approval", {"event": "go"})
    send_event(run, "go", "once")
    drain()
    JobRun.objects.filter(pk=run.pk).update(status=Status.FAILED)
    retry(run.pk, reset_steps=True)
    drain()
    assert fresh(run).output == ["once"]
    assert Execution.objects.filter(run_id=run.pk).count() == 2


def test_a_handler_cannot_block_on_another_run() -> None:
    other = start("tests.noop")
    run = start("tests.waits_inside", {"run": other.pk})
    drain()
    failed = fresh(run)
    assert failed.status == Status.FAILED
    assert "ctx.wait_for()" in failed.error["message"]


# --- debounce ------------------------------------------------------------------------------


def test_a_debounced_start_moves_the_unstarted_run_and_replaces_its_input() -> None:
    first = start("tests.echo", {"n": 1}, idempotency_key="doc-7", debounce=30)
    assert timedelta(seconds=25) < first.run_at - timezone.now() <= timedelta(seconds=30)
    second = start("tests.echo", {"n": 2}, idempotency_key="doc-7", debounce=60)
    assert second.pk == first.pk
    moved = fresh(first)
    assert moved.input == {"n": 2}
    assert moved.run_at - timezone.now() > timedelta(seconds=55)
    assert JobRun.objects.count() == 1


def test_once_started_a_debounced_start_makes_a_new_run_that_takes_the_key() -> None:
    first = start("tests.echo", {"n": 1}, idempotency_key="doc-7", debounce=30)
    JobRun.objects.filter(pk=first.pk).update(run_at=timezone.now())
    assert drain("echo") == 1
    second = start("tests.echo", {"n": 2}, idempotency_key="doc-7", debounce=30)
    assert second.pk != first.pk
    assert fresh(first).idempotency_key is None
    assert (fresh(second).idempotency_key, fresh(second).input) == ("doc-7", {"n": 2})
    # Without debounce, the key finds the run that holds it.
    assert start("tests.echo", {"n": 3}, idempotency_key="doc-7").pk == second.pk


def test_debounce_needs_a_key_and_no_other_time() -> None:
    with pytest.raises(TypeError, match="idempotency_key"):
        start("tests.echo", debounce=5)
    with pytest.raises(TypeError, match="no run_at or delay"):
        start("tests.echo", idempotency_key="k", debounce=5, delay=3)
    with pytest.raises(TypeError, match="start_many"):
        start_many("tests.echo", [{}], debounce=5)
    with pytest.raises((TypeError, ValueError, InvalidJobInput)):
        start("tests.echo", idempotency_key="k", debounce=-1)
    assert not JobRun.objects.exists()


def test_concurrent_debounced_starts_leave_one_run() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serves one process; its writers do not race")
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def starter(n: int) -> None:
        try:
            barrier.wait()
            start("tests.echo", {"n": n}, idempotency_key="burst", debounce=30)
        except BaseException as exc:  # named by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=starter, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    (run,) = JobRun.objects.all()
    assert run.input["n"] in range(8)
    last = start("tests.echo", {"n": "last"}, idempotency_key="burst", debounce=30)
    assert (last.pk, fresh(last).input) == (run.pk, {"n": "last"})


def test_jobstatus_counts_the_runs_waiting_for_an_event() -> None:
    from django_jobs.management.commands.jobstatus import render
    from django_jobs.snapshot import snapshot

    for _ in range(3):
        start("tests.approval")
    start("tests.approval", pool="other")
    drain()
    shot = snapshot()
    by_pool = {pool.name: pool for pool in shot.pools}
    assert (by_pool["default"].waiting_for_event, by_pool["other"].waiting_for_event) == (3, 1)
    assert by_pool["default"].counts["waiting"] == 3
    assert "default waiting: 3 runs wait for an event" in render(shot)
    (default,) = [p for p in shot.as_json()["pools"] if p["pool"] == "default"]
    assert default["waiting_for_event"] == 3


def test_pruning_a_finished_run_deletes_its_events() -> None:
    from django_jobs.retention import prune

    run = start("tests.approval")
    send_event(run, "approved", "taken")
    send_event(run, "other", "kept")
    drain()
    assert fresh(run).status == Status.COMPLETED
    JobRun.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=30))
    result = prune(older_than=timedelta(days=7))
    assert result.runs == 1
    assert not JobEvent.objects.exists()


def test_names_match_exactly_on_every_database() -> None:
    run = start("tests.approval")
    send_event(run, "Approved", "other case")
    send_event(run, "approvéd", "other accent")
    drain()
    assert fresh(run).status == Status.WAITING
    send_event(run, "approved", "this one")
    drain()
    assert fresh(run).output == ["this one"]


def test_a_canceled_wait_leaves_no_deadline_behind() -> None:
    run = start("tests.approval")
    drain()
    cancel(run.pk)
    done = fresh(run)
    assert (done.status, done.awaiting_event) == (Status.CANCELED, None)
    assert done.run_at < timezone.now() + timedelta(seconds=5)


def test_wait_inside_a_transaction_returns_a_finished_run_and_refuses_an_unfinished_one() -> None:
    finished = start("tests.noop")
    drain()
    unfinished = start("tests.noop")
    with transaction.atomic():
        assert finished.wait(timeout=1) is None
        with pytest.raises(RuntimeError, match=r"inside transaction\.atomic"):
            unfinished.wait(timeout=1)


def test_a_moved_debounced_run_takes_the_last_starts_keys_and_options() -> None:
    first = start(
        "tests.echo", {"n": 1}, idempotency_key="d", debounce=30, concurrency_key="a", priority=1
    )
    start("tests.echo", {"n": 2}, idempotency_key="d", debounce=30, concurrency_key="b", tags=["x"])
    moved = fresh(first)
    assert (moved.input, moved.concurrency_key, moved.priority, moved.tags) == (
        {"n": 2},
        "b",
        0,
        ["x"],
    )
