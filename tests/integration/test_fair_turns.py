"""Fair turns (``storage.turns``): within a priority, claims take turns across
tenants, so that one tenant's burst never puts another tenant's run behind it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobs import start, start_many
from django_jobs.checks import check_settings
from django_jobs.models import LATER, JobRun, Status
from django_jobs.storage import claiming, leases, turns
from tests.factories import WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def claim(limit: int = 16, pools: list[str] | None = None) -> list[int]:
    """The ids a claim took, in claim order. (A claim's batch starts at once: its
    runs come back by priority and age, not by turn.)"""
    taken = claiming.claim_batch(WorkerFactory().pk, pools or ["default"], limit)
    return [c.run_id for c in taken]


def tenants_of(ids: list[int]) -> list[str | None]:
    return sorted(JobRun.objects.filter(pk__in=ids).values_list("tenant_id", flat=True))


def turn_of(run: JobRun) -> int:
    return int(JobRun.objects.values_list("turn", flat=True).get(pk=run.pk))


def test_a_run_of_another_tenant_is_claimed_before_a_burst_drains(claim_forms: str) -> None:
    burst = start_many("tests.noop", [{}] * 200, tenant_id="a")
    other = start("tests.noop", tenant_id="b")
    # b's run takes the turn at the head: after a's first run, before its second.
    assert set(claim()) == {burst[0].pk, other.pk, *[run.pk for run in burst[1:15]]}
    # Later in the burst, the same: a new run of b (or of no tenant) waits for
    # the runs of a claim at most, not for the 185 runs of a still ready.
    for _ in range(3):
        claim()
    late = start("tests.noop", tenant_id="b")
    untenanted = start("tests.noop")
    taken = claim()
    assert {late.pk, untenanted.pk} <= set(taken)


def test_bursts_of_two_tenants_alternate(claim_forms: str) -> None:
    first = start_many("tests.noop", [{}] * 50, tenant_id="a")
    second = start_many("tests.noop", [{}] * 50, tenant_id="b")
    for n in range(5):
        taken = claim(4)
        # Each tenant's own runs in the order they were started.
        pairs = [first[2 * n].pk, first[2 * n + 1].pk, second[2 * n].pk, second[2 * n + 1].pk]
        assert sorted(taken) == sorted(pairs)


def test_one_tenant_alone_is_claimed_in_the_order_of_its_starts(claim_forms: str) -> None:
    started = [start("tests.noop", tenant_id="a") for _ in range(5)]
    started += start_many("tests.noop", [{}] * 5, tenant_id="a")
    started += [start("tests.noop", tenant_id="a") for _ in range(5)]
    assert claim(20) == [run.pk for run in started]


def test_priority_comes_before_turns(claim_forms: str) -> None:
    burst = start_many("tests.noop", [{}] * 30, tenant_id="a", priority=5)
    other = start("tests.noop", tenant_id="b")
    assert claim(30) == [run.pk for run in burst]
    assert claim() == [other.pk]


def test_a_run_not_due_yet_waits_after_every_turn_then_takes_one() -> None:
    burst = start_many("tests.noop", [{}] * 40, tenant_id="a")
    later = start("tests.noop", tenant_id="b", delay=3600)
    assert turn_of(later) == LATER
    # Due now (its time moved as the clock would): claimed after the others of
    # its priority until a turn is given, then at the head.
    JobRun.objects.filter(pk=later.pk).update(run_at=timezone.now() - timedelta(seconds=1))
    assert later.pk not in claim(10)
    assert turns.give_turns(["default"]) == 1
    assert turns.give_turns(["default"]) == 0
    assert set(claim(2)) == {burst[10].pk, later.pk}


def test_due_runs_of_every_priority_and_kind_are_given_turns() -> None:
    """The worker's pass probes each priority of each kind, the lowest and highest a
    priority can be included, and gives turns in the order the runs came due."""
    priorities = [32767, 5, 0, -32768]
    for priority in priorities:
        start_many("tests.noop", [{}] * 2, priority=priority, delay=60)
    start("tests.async_echo", delay=60)
    assert JobRun.objects.exclude(turn=LATER).count() == 0
    assert turns.give_turns(["default"]) == 0  # not due yet
    JobRun.objects.update(run_at=timezone.now() - timedelta(seconds=1))
    assert turns._priorities("default", False) == priorities
    assert turns.give_turns(["default"]) == 9
    assert JobRun.objects.filter(turn=LATER).count() == 0
    assert turns.give_turns(["default"]) == 0


def test_a_retry_after_a_backoff_waits_for_a_turn() -> None:
    start("tests.noop", tenant_id="a")
    (taken,) = claiming.claim_batch(WorkerFactory().pk, ["default"], 1)
    assert leases.reschedule(taken, {"message": "again"}, 60)
    assert JobRun.objects.get(pk=taken.run_id).turn == LATER
    start("tests.noop", tenant_id="a")
    (again,) = claiming.claim_batch(WorkerFactory().pk, ["default"], 1)
    assert leases.reschedule(again, {"message": "again"}, 0)
    # Due at once: it keeps its turn.
    assert JobRun.objects.get(pk=again.run_id).turn < LATER


def test_a_tenant_burst_given_turns_when_due_spreads_over_them() -> None:
    waiting = start_many("tests.noop", [{}] * 10, tenant_id="a", delay=60)
    other = start_many("tests.noop", [{}] * 3, tenant_id="b", delay=60)
    JobRun.objects.update(run_at=timezone.now() - timedelta(seconds=1))
    assert turns.give_turns() == 13
    taken = claim(6)
    assert tenants_of(taken) == ["a"] * 3 + ["b"] * 3
    assert set(taken) == {*[run.pk for run in waiting[:3]], *[run.pk for run in other]}


def test_without_fair_turns_the_order_is_priority_then_age(claim_forms: str) -> None:
    with override_settings(DJANGO_JOBS={"FAIR_TURNS": False}):
        burst = start_many("tests.noop", [{}] * 30, tenant_id="a")
        other = start("tests.noop", tenant_id="b")
        later = start("tests.noop", tenant_id="b", delay=60)
        assert {run.turn for run in [*burst, other, later]} == {0}
        assert claim(31) == [*[run.pk for run in burst], other.pk]


@pytest.mark.parametrize("value", [1, "yes", None])
def test_fair_turns_must_be_a_boolean(value: Any) -> None:
    with override_settings(DJANGO_JOBS={"FAIR_TURNS": value}):
        errors = [m.msg for m in check_settings() if m.id == "django_jobs.E001"]
    assert any("FAIR_TURNS must be True or False" in message for message in errors), errors


def test_a_hundred_tenants_each_get_a_turn_before_anyone_a_second(claim_forms: str) -> None:
    for tenant in range(100):
        start_many("tests.noop", [{}] * 3, tenant_id=f"t{tenant}")
    taken = claim(100)
    assert len(set(tenants_of(taken))) == 100
    assert JobRun.objects.filter(status=Status.PENDING).count() == 200


@pytest.mark.postgresql("PostgreSQL's plans (MariaDB reads the turns index through ready_turn)")
def test_a_start_reads_a_turn_through_the_indexes() -> None:
    start_many("tests.noop", [{}] * 2000, tenant_id="a")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_jobs_jobrun")
    ready = JobRun.objects.filter(status="pending", hold="", pool="default", turn__lt=LATER)
    head = ready.filter(priority=0, is_async=False).order_by("turn").values("turn")[:1]
    last = ready.filter(priority=0, tenant_id="a").order_by("-turn").values("turn")[:1]
    assert "django_jobs_run_claim_kind" in head.explain()
    assert "django_jobs_run_turns" in last.explain()
