"""What every fault test checks once the fleet has drained (tests.chaos runs)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable

from django_jobs.models import JobRun, JobStep, Status
from tests.helpers import WorkerProcess
from tests.testapp.models import Execution

StartWorker = Callable[..., WorkerProcess]


def assert_every_run_completed_once(runs: int) -> None:
    """All runs completed with their output, and no recorded step ran again."""
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == runs
    assert JobRun.objects.filter(output=3).count() == runs
    recorded = JobStep.objects.filter(status="completed")
    assert recorded.count() == 3 * runs
    for step in recorded.iterator():
        # A side effect of a step newer than its record means it ran again.
        again = Execution.objects.filter(
            run_id=step.run_id,
            job_type=f"effect:{step.step_id}",
            started_at__gt=step.finished_at,
        )
        assert not again.exists(), f"step {step.step_id} of run {step.run_id} ran again"
    assert not JobRun.objects.filter(status=Status.RUNNING).exists()


def assert_alive_and_stop_cleanly(workers: Iterable[WorkerProcess]) -> None:
    """The workers lived through it, and still answer SIGTERM with a clean exit."""
    for worker in workers:
        assert worker.proc.poll() is None, worker.output()[-2000:]
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker.output()[-2000:]
