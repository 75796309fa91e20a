"""A schedule's runs cannot be taken over through idempotency keys.

The runs a schedule starts carry the key ``schedule:<name>:<UTC instant>``. A
caller that lets its clients choose keys could otherwise create a tick's run
first, with its own input, and the scheduler would adopt it at the tick: the
schedule's own input would never run. Those keys are a namespace of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from django_jobs import Schedule, astart, job, start
from django_jobs.exceptions import InvalidJobInput
from django_jobs.models import JobRun
from django_jobs.registry import unregister
from django_jobs.scheduler import run_schedules
from django_jobs.testing import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

TICK_KEY = "schedule:keys.hourly:2026-01-01T10:00:00Z"


@pytest.fixture
def hourly() -> Iterator[None]:
    @job("keys.hourly", schedule=Schedule("0 * * * *", timezone="UTC", input={"from": "code"}))
    def handler(ctx: Any) -> Any:
        return ctx.input

    yield
    unregister("keys.hourly")


@pytest.mark.parametrize("tenant_id", [None, "acme"])
def test_a_caller_cannot_take_a_schedules_key(tenant_id: str | None) -> None:
    for key in (TICK_KEY, "schedule:", "schedule:anything"):
        with pytest.raises(InvalidJobInput, match="reserved for the runs schedules start"):
            start("tests.echo", {"from": "caller"}, idempotency_key=key, tenant_id=tenant_id)
        with pytest.raises(InvalidJobInput, match="reserved"):
            asyncio.run(astart("tests.echo", idempotency_key=key, tenant_id=tenant_id))
    assert not JobRun.objects.exists()
    # Other keys, even alike, are the caller's.
    assert start("tests.echo", idempotency_key="Schedule:x").idempotency_key == "Schedule:x"
    assert start("tests.echo", idempotency_key="my-schedule:x").pk


@pytest.mark.usefixtures("hourly")
def test_the_tick_runs_the_schedules_own_input() -> None:
    assert run_schedules(datetime(2026, 1, 1, 9, 30, tzinfo=UTC)) == []
    with pytest.raises(InvalidJobInput):
        start("keys.hourly", {"from": "caller"}, idempotency_key=TICK_KEY)
    (run,) = run_schedules(datetime(2026, 1, 1, 10, 0, 5, tzinfo=UTC))
    assert (run.idempotency_key, run.input, run.trigger_source) == (
        TICK_KEY,
        {"from": "code"},
        "schedule",
    )
    assert drain() == 1
    assert JobRun.objects.get().output == {"from": "code"}


def test_a_task_schedule_keeps_its_key_and_tasks_cannot_pass_one(settings: Any) -> None:
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "SCHEDULES": {
            "keys.add": {
                "job_type": "tests.testapp.tasks.add",
                "cron": "@hourly",
                "timezone": "UTC",
                "input": {"args": [1, 2]},
            }
        },
    }
    run_schedules(datetime(2026, 1, 1, 9, 30, tzinfo=UTC))
    (run,) = run_schedules(datetime(2026, 1, 1, 10, 0, 1, tzinfo=UTC))
    assert run.idempotency_key == "schedule:keys.add:2026-01-01T10:00:00Z"
    assert tasks.add.enqueue(1, 2).id  # an ordinary enqueue has no key to misuse
