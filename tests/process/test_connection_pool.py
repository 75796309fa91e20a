"""Workers on Django's connection pool (``OPTIONS["pool"]``) at its default size (issue 17).

psycopg_pool lends at most 4 connections by default. A worker holds one per
slot and one for its control threads, so without --concurrency it runs 3 slots
there (the default, capped, said in one line) and every durable feature works;
a --concurrency the pool cannot serve is refused at start, in one line, instead
of threads that wait for connections for ever.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_jobs import cancel, start, start_many
from django_jobs.models import JobRun, JobStep, Status, Worker
from tests.helpers import WorkerProcess, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.process,
    pytest.mark.postgresql("Django's connection pool serves PostgreSQL only"),
]

StartWorker = Callable[..., WorkerProcess]
POOL = {"DJANGO_SETTINGS_MODULE": "tests.process.pool_settings", "DJANGO_JOBS_CANCEL_GRACE": "1"}


def status(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def test_every_durable_feature_works_on_djangos_pool(start_worker: StartWorker) -> None:
    retried = start("tests.flaky", {"succeed_on": 3})
    stepped = start("tests.three_steps", {})
    parent = start("tests.parent", {"n": 3})
    sleeper = start("tests.sleeper", {"seconds": 0.5})
    keyed = [start("tests.keyed", {"key": "k"}) for _ in range(3)]
    timed_out = start("tests.slow", {})
    doomed = start("tests.cooperative", {})
    worker = start_worker("--pool", "default", "--pool", "echo", **POOL)
    wait_until(lambda: status(doomed) == Status.RUNNING, timeout=60)
    cancel(doomed.pk)
    expected = {
        retried.pk: Status.COMPLETED,
        stepped.pk: Status.COMPLETED,
        parent.pk: Status.COMPLETED,
        sleeper.pk: Status.COMPLETED,
        timed_out.pk: Status.TIMED_OUT,
        doomed.pk: Status.CANCELED,
        **{run.pk: Status.COMPLETED for run in keyed},
    }

    def ended() -> bool:
        rows = dict(JobRun.objects.filter(pk__in=expected).values_list("pk", "status"))
        return rows == expected

    wait_until(ended, timeout=90)
    assert JobRun.objects.get(pk=retried.pk).attempts == 3
    assert JobStep.objects.filter(run=stepped).count() == 3
    assert JobRun.objects.filter(parent=parent, status=Status.COMPLETED).count() == 3
    assert worker.proc.poll() is None, worker.output()
    assert "unavailable" not in worker.output()


def test_a_pool_too_small_for_the_concurrency_is_refused_in_one_line(
    start_worker: StartWorker,
) -> None:
    # Without async slots (the test app has async handlers, which need two more).
    sync_only = ("--async-concurrency", "0")
    worker = start_worker("--pool", "default", "--concurrency", "4", *sync_only, **POOL)
    assert worker.wait(timeout=60) == 1
    output = worker.output().strip()
    assert output.splitlines()[-1] == (
        "CommandError: --concurrency 4 needs 5 connections from Django's connection pool "
        "for database 'default', which lends at most 4: set OPTIONS['pool'] = "
        "{'max_size': 5} or more, or lower --concurrency."
    )
    worker = start_worker("--pool", "default", "--concurrency", "3", "--burst", *sync_only, **POOL)
    assert worker.wait(timeout=60) == 0, worker.output()
    # With them: a database thread of the event loop's and Django's sync thread.
    worker = start_worker("--pool", "default", "--concurrency", "2", **POOL)
    assert worker.wait(timeout=60) == 1
    assert worker.output().strip().splitlines()[-1] == (
        "CommandError: --concurrency 2 and --async-concurrency 100 need 5 connections from "
        "Django's connection pool for database 'default', which lends at most 4: set "
        "OPTIONS['pool'] = {'max_size': 5} or more, or lower --concurrency (or pass "
        "--async-concurrency 0)."
    )


def test_without_the_flag_the_default_concurrency_is_capped_to_the_pool(
    start_worker: StartWorker,
) -> None:
    start("tests.three_steps", {})
    worker = start_worker("--pool", "default", "--burst", "--async-concurrency", "0", **POOL)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert worker.output().count("concurrency=3 default=16 database=default pool_max_size=4") == 1
    assert Worker.objects.get(pid=worker.pid).concurrency == 3
    assert JobRun.objects.get().status == Status.COMPLETED


def test_async_runs_on_a_pool_of_four(start_worker: StartWorker) -> None:
    # One slot thread, the control threads', one database thread of the event
    # loop's and Django's sync thread: the four the pool lends.
    stepped = start_many("tests.async_three_steps", [{}] * 20)
    parent = start("tests.async_parent", {"n": 3})
    sync_run = start("tests.three_steps", {})
    worker = start_worker("--pool", "default", "--burst", **POOL)
    assert worker.wait(timeout=90) == 0, worker.output()
    assert worker.output().count("concurrency=1 default=16 database=default pool_max_size=4") == 1
    runs = [*stepped, parent, sync_run]
    assert {status(run) for run in runs} == {Status.COMPLETED}
    assert "unavailable" not in worker.output()
