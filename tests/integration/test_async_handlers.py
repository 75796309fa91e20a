"""``async def`` handlers: the durable operations' async forms, under ``drain()`` and on a
worker's event loop in this process (tests/process/test_async_process.py runs real workers)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import OperationalError

from django_jobs import claimer, start, start_many
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.storage.claiming import Claim
from django_jobs.testing import drain
from django_jobs.worker import EXIT_OK, JobWorker
from tests.testapp import jobs
from tests.testapp.models import Execution


def effects(run: JobRun, name: str) -> int:
    return Execution.objects.filter(run_id=run.pk, job_type=f"effect:{name}").count()


def refreshed(run: JobRun) -> JobRun:
    run.refresh_from_db()
    return run


@pytest.mark.django_db
class TestUnderDrain:
    """``drain()`` runs an async handler to its end on the caller's thread and transaction."""

    def test_output_of_an_async_handler(self) -> None:
        run = start("tests.async_echo", {"x": 1})
        assert drain() == 1
        assert (refreshed(run).status, run.output) == (Status.COMPLETED, {"x": 1})

    def test_steps_are_recorded_and_replayed_after_a_retry(self) -> None:
        run = start("tests.async_three_steps", {"fail_c_until": 2})
        assert drain() == 2  # the retry has no delay: due at once
        assert (refreshed(run).status, run.attempts) == (Status.COMPLETED, 2)
        assert (effects(run, "a"), effects(run, "b")) == (1, 1)
        assert (effects(run, "c-started"), effects(run, "c")) == (2, 1)
        assert set(JobStep.objects.filter(run=run).values_list("step_id", "status")) == {
            ("a", "completed"),
            ("b", "completed"),
            ("c", "completed"),
        }

    def test_an_atomic_async_step_rolls_back_its_orm_writes_with_it(self) -> None:
        run = start("tests.async_atomic_step")
        assert drain() == 2
        assert (refreshed(run).status, run.attempts) == (Status.COMPLETED, 2)
        # The first attempt's write was rolled back with its step: one row, the second's.
        assert effects(run, "write") == 1
        assert run.output == Execution.objects.get(run_id=run.pk).pk

    def test_children_are_spawned_once_and_awaited(self) -> None:
        parent = start("tests.async_parent", {"n": 2, "fail_first": True})
        drain()
        drain()
        parent = refreshed(parent)
        assert parent.status == Status.COMPLETED, parent.error
        assert parent.output["outputs"] == [{"i": 0}, {"i": 1}]
        assert JobRun.objects.filter(parent=parent).count() == 2  # not 4: replayed

    def test_a_failed_child_raises_in_the_parent(self) -> None:
        parent = start("tests.async_parent_of_failure")
        drain()
        drain()
        assert refreshed(parent).output == "ChildRunFailed"

    def test_a_durable_sleep_suspends_the_run(self) -> None:
        run = start("tests.async_sleeper", {"seconds": 3600})
        drain()
        assert refreshed(run).status == Status.WAITING
        assert (effects(run, "before"), effects(run, "after")) == (1, 0)

    def test_a_short_sleep_resumes_with_steps_replayed(self) -> None:
        run = start("tests.async_sleeper", {"seconds": 1.5})
        drain()
        assert refreshed(run).status == Status.WAITING
        time.sleep(1.6)
        assert drain() == 1
        assert (refreshed(run).status, run.attempts) == (Status.COMPLETED, 1)
        assert (effects(run, "before"), effects(run, "after")) == (1, 1)

    def test_the_sync_step_in_an_async_handler_names_astep(self) -> None:
        run = start("tests.async_sync_step")
        drain()
        run = refreshed(run)
        assert run.status == Status.FAILED
        assert run.error["type"] == "builtins.TypeError"
        assert "await ctx.astep(" in run.error["message"]

    def test_progress_from_an_async_handler(self) -> None:
        run = start("tests.async_progress", {"items": 3})
        drain()
        run = refreshed(run)
        assert run.status == Status.COMPLETED
        assert (run.progress["done"], run.progress["total"], run.progress["message"]) == (
            3,
            3,
            "all done",
        )

    def test_a_cancel_requested_before_the_attempt(self) -> None:
        run = start("tests.async_echo")
        JobRun.objects.filter(pk=run.pk).update(cancel_requested_at=run.created_at)
        drain()
        assert refreshed(run).status == Status.CANCELED


@pytest.mark.django_db(transaction=True)
class TestOnTheEventLoop:
    """A JobWorker in this process runs async handlers as tasks on its event loop."""

    def test_many_async_runs_at_once_with_one_thread(self) -> None:
        jobs.together.update(now=0, most=0)
        runs = start_many("tests.async_together", [{"n": 30}] * 30)
        worker = JobWorker(
            ["default"], concurrency=1, async_concurrency=30, burst=True, poll_interval=0.05
        )
        assert worker.run() == EXIT_OK
        outputs = list(
            JobRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", "output")
        )
        # Every run saw all 30 running together, with one thread for sync handlers.
        assert outputs == [(Status.COMPLETED, 30)] * 30

    def test_async_concurrency_bounds_the_runs_at_once(self) -> None:
        jobs.together.update(now=0, most=0)
        start_many("tests.async_together", [{"n": 99, "timeout": 0.3}] * 12)
        worker = JobWorker(
            ["default"], concurrency=1, async_concurrency=4, burst=True, poll_interval=0.05
        )
        assert worker.run() == EXIT_OK
        assert jobs.together["most"] == 4
        assert set(JobRun.objects.values_list("output", flat=True)) <= {1, 2, 3, 4}

    def test_sync_and_async_runs_share_a_pool_and_a_worker(self) -> None:
        sync_runs = start_many("tests.record", [{}] * 5)
        async_runs = start_many("tests.async_three_steps", [{}] * 5)
        worker = JobWorker(["default"], concurrency=2, burst=True, poll_interval=0.05)
        assert worker.run() == EXIT_OK
        assert set(JobRun.objects.values_list("status", flat=True)) == {Status.COMPLETED}
        assert worker.claimed == worker.finished == 10
        assert Execution.objects.filter(job_type="tests.record").count() == len(sync_runs)
        assert Execution.objects.filter(job_type="effect:c").count() == len(async_runs)

    def test_without_async_slots_async_handlers_run_in_the_threads(self) -> None:
        runs = start_many("tests.async_three_steps", [{}] * 3)
        worker = JobWorker(
            ["default"], concurrency=1, async_concurrency=0, burst=True, poll_interval=0.05
        )
        assert worker.run() == EXIT_OK
        assert worker._event_loop is None
        assert {refreshed(run).status for run in runs} == {Status.COMPLETED}

    def test_a_timeout_cancels_the_task(self) -> None:
        run = start("tests.async_slow", {"seconds": 5})
        worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
        assert worker.run() == EXIT_OK
        run = refreshed(run)
        assert run.status == Status.TIMED_OUT
        assert (effects(run, "slow"), effects(run, "late")) == (1, 0)

    def test_retries_children_and_failures_on_the_loop(self) -> None:
        parent = start("tests.async_parent", {"n": 3, "fail_first": True})
        failing = start("tests.async_parent_of_failure")
        worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
        assert worker.run() == EXIT_OK
        parent = refreshed(parent)
        assert (parent.status, parent.attempts) == (Status.COMPLETED, 2)
        assert parent.output["outputs"] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert JobRun.objects.filter(parent=parent).count() == 3
        assert refreshed(failing).output == "ChildRunFailed"

    def test_the_threads_claim_runs_even_when_the_loops_claim_after_it_fails(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        sync_runs = start_many("tests.record", [{}] * 5)
        async_runs = start_many("tests.async_echo", [{"i": i} for i in range(5)])
        real = claimer.claim_batch
        failed: list[bool] = []

        def flaky(*args: Any, **kwargs: Any) -> list[Claim]:
            if kwargs.get("kind") is True and not failed:
                failed.append(True)
                raise OperationalError("server closed the connection unexpectedly")
            return real(*args, **kwargs)

        monkeypatch.setattr(claimer, "claim_batch", flaky)
        worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
        assert worker.run() == EXIT_OK
        assert failed == [True]
        assert {refreshed(run).status for run in sync_runs + async_runs} == {Status.COMPLETED}
        assert worker.claimed == 10
