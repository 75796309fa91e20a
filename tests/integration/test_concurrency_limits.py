"""Concurrency limits: at most N runs of a key running at once, by the database
(a slot per running run, unique per key), claimed, held and released by N."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction

from django_jobs import job, start, start_many
from django_jobs.models import Hold, JobRun, Status
from django_jobs.registry import unregister
from django_jobs.storage import claiming, holds, leases
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def claim(limit: int = 10) -> list[claiming.Claim]:
    return claiming.claim_batch(WorkerFactory().pk, ["default"], limit)


def running_slots(key: str) -> list[int | None]:
    return sorted(
        JobRun.objects.filter(status=Status.RUNNING, concurrency_key=key).values_list(
            "concurrency_slot", flat=True
        )
    )


def test_a_limit_is_an_integer_from_1_to_1000() -> None:
    with pytest.raises(ValueError, match="between 1 and 1000"):
        start("tests.keyed", {"key": "k"}, concurrency_limit=0)
    with pytest.raises(ValueError, match="between 1 and 1000"):
        start("tests.keyed", {"key": "k"}, concurrency_limit=1001)
    with pytest.raises(TypeError, match="must be an integer"):
        start("tests.keyed", {"key": "k"}, concurrency_limit=True)
    with pytest.raises(TypeError, match="must be an integer"):
        start_many("tests.keyed", [{"key": "k"}], concurrency_limit="3")
    with pytest.raises(TypeError, match="must be an integer"):
        job("tests.bad_limit", concurrency_key="k", concurrency_limit=2.5)  # type: ignore[arg-type]
    assert not JobRun.objects.exists()


def test_the_jobs_limit_is_the_runs_unless_start_gives_one() -> None:
    assert start("tests.limited_retried", {"key": "k"}).concurrency_limit == 3
    assert start("tests.limited_retried", {"key": "k"}, concurrency_limit=5).concurrency_limit == 5
    assert start("tests.keyed", {"key": "k"}).concurrency_limit == 1
    stored = JobRun.objects.order_by("id").values_list("concurrency_limit", flat=True)
    assert list(stored) == [3, 5, 1]


def test_the_database_refuses_a_slot_of_a_key_taken_twice() -> None:
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=2, concurrency_slot=1)
    other = JobRunFactory(concurrency_key="k", concurrency_limit=2)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=other.pk).update(status=Status.RUNNING, concurrency_slot=1)
    # A run claimed without a slot (a worker of an older release) holds slot 0.
    JobRun.objects.filter(pk=other.pk).update(status=Status.RUNNING, concurrency_slot=None)
    third = JobRunFactory(concurrency_key="k", concurrency_limit=2)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=third.pk).update(status=Status.RUNNING, concurrency_slot=0)


def test_a_claim_takes_as_many_runs_of_a_key_as_its_limit(claim_forms: str) -> None:
    runs = start_many("tests.limited_retried", [{"key": "k", "n": n} for n in range(5)])
    other = start("tests.keyed", {"key": "other"})
    batch = claim(10)
    assert sorted(c.run_id for c in batch) == sorted([*(r.pk for r in runs[:3]), other.pk])
    assert running_slots("k") == [0, 1, 2]
    assert running_slots("other") == [0]
    assert claim(10) == []
    # One ends: its slot is free again, for the next run in claim order.
    middle = next(c for c in batch if c.run_id == runs[1].pk)
    assert leases.complete(middle, None)
    assert [c.run_id for c in claim(10)] == [runs[3].pk]
    assert running_slots("k") == [0, 1, 2]


def test_a_claim_fills_the_free_slots_beside_running_runs(claim_forms: str) -> None:
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=4, concurrency_slot=0)
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=4, concurrency_slot=2)
    waiting = [JobRunFactory(concurrency_key="k", concurrency_limit=4) for _ in range(4)]
    assert sorted(c.run_id for c in claim(10)) == [waiting[0].pk, waiting[1].pk]
    assert running_slots("k") == [0, 1, 2, 3]


def test_runs_of_one_key_and_another_limit_count_the_same_running_runs(claim_forms: str) -> None:
    # Two runs of a key of limit 2 run; a run of the same key and limit 1 waits
    # until none runs, and one of limit 3 takes the third slot.
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=2, concurrency_slot=0)
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=2, concurrency_slot=1)
    JobRunFactory(concurrency_key="k", concurrency_limit=1, priority=5)
    wider = JobRunFactory(concurrency_key="k", concurrency_limit=3)
    assert [c.run_id for c in claim(10)] == [wider.pk]
    assert running_slots("k") == [0, 1, 2]


def test_racing_claimers_never_run_more_of_a_key_than_its_limit(claim_forms: str) -> None:
    for round_ in range(10):
        JobRun.objects.all().delete()
        workers = [WorkerFactory() for _ in range(6)]
        for n in range(60):
            JobRunFactory(concurrency_key=f"key:{n % 3}", concurrency_limit=2)
        barrier = threading.Barrier(len(workers))

        def claim_once(worker_id: Any, barrier: threading.Barrier = barrier) -> list[int]:
            try:
                barrier.wait(10)
                return [c.run_id for c in claiming.claim_batch(worker_id, ["default"], 10)]
            finally:
                connections.close_all()

        with ThreadPoolExecutor(len(workers)) as pool:
            claimed = [i for got in pool.map(claim_once, [w.pk for w in workers]) for i in got]
        running = JobRun.objects.filter(status=Status.RUNNING)
        assert running.count() == len(claimed) <= 6, round_
        for key in ("key:0", "key:1", "key:2"):
            assert len(running_slots(key)) <= 2, (round_, key)
            assert set(running_slots(key)) <= {0, 1}, (round_, key)


def test_runs_are_held_at_start_only_once_the_limit_is_reached() -> None:
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=3, concurrency_slot=0)
    RunningJobRunFactory(concurrency_key="k", concurrency_limit=3, concurrency_slot=1)
    assert start("tests.limited_retried", {"key": "k"}).hold == Hold.READY
    (claimed,) = claim(10)
    started = start_many("tests.limited_retried", [{"key": "k"}] * 4)
    assert {run.hold for run in started} == {Hold.KEY}
    # One of three ends: one held run is released, the others stay held.
    assert leases.complete(claimed, None)
    holds = list(
        JobRun.objects.filter(pk__in=[r.pk for r in started])
        .order_by("id")
        .values_list("hold", flat=True)
    )
    assert holds == [Hold.READY, Hold.KEY, Hold.KEY, Hold.KEY]


def test_the_workers_pass_holds_runs_of_full_keys_and_the_sweep_releases_by_room() -> None:
    RunningJobRunFactory(concurrency_key="full", concurrency_limit=2, concurrency_slot=0)
    RunningJobRunFactory(concurrency_key="full", concurrency_limit=2, concurrency_slot=1)
    RunningJobRunFactory(concurrency_key="roomy", concurrency_limit=3, concurrency_slot=0)
    full = [JobRunFactory(concurrency_key="full", concurrency_limit=2) for _ in range(3)]
    roomy = [JobRunFactory(concurrency_key="roomy", concurrency_limit=3) for _ in range(3)]
    assert holds.hold_taken() == 3
    assert {
        hold for (hold,) in JobRun.objects.filter(pk__in=[r.pk for r in full]).values_list("hold")
    } == {Hold.KEY}
    assert not JobRun.objects.filter(pk__in=[r.pk for r in roomy], hold=Hold.KEY).exists()
    # Held by hand, as a crash between a start and its release would leave them:
    # the sweep makes ready as many as there is room for (3 - 1 running).
    JobRun.objects.filter(pk__in=[r.pk for r in roomy]).update(hold=Hold.KEY)
    assert holds.release_stranded() == 2
    # A full key's runs stay held until a slot frees.
    JobRun.objects.filter(concurrency_key="full", status=Status.RUNNING).first().delete()  # type: ignore[union-attr]
    assert holds.release_stranded() == 1
    assert holds.release_stranded() == 0


@pytest.fixture
def wide_job() -> Any:
    @job("tests.wide", concurrency_key="wide", concurrency_limit=4)
    def wide(ctx: Any) -> None:
        return None

    yield wide
    unregister("tests.wide")


def test_drain_runs_every_run_of_a_limited_key(wide_job: Any) -> None:
    from django_jobs.testing import drain

    wide_job.start_many([{}] * 10)
    assert drain() == 10
    assert JobRun.objects.filter(status=Status.COMPLETED).count() == 10


def test_the_run_page_names_the_runs_that_hold_a_full_keys_slots(admin_client: Any) -> None:
    from django.urls import reverse

    first = RunningJobRunFactory(concurrency_key="k", concurrency_limit=2, concurrency_slot=0)
    (held,) = start_many("tests.limited_retried", [{"key": "k"}], concurrency_limit=2)
    url = reverse("admin:django_jobs_jobrun_change", args=[held.pk])
    # One slot of two is free: nothing keeps the run back.
    assert "whose 2 slots" not in admin_client.get(url).content.decode()
    second = RunningJobRunFactory(concurrency_key="k", concurrency_limit=2, concurrency_slot=1)
    content = admin_client.get(url).content.decode()
    assert "whose 2 slots" in content
    named = content.split("whose 2 slots")[1][:800]
    assert f"/{first.pk}/change/" in named
    assert f"/{second.pk}/change/" in named
    assert "concurrency limit" in content.lower()
