"""Async callers: the a-forms of the API; async code is told what the sync API cannot do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import SynchronousOnlyOperation
from django.db import transaction

from django_jobs import acancel, aretry, astart, astart_many, job, start, start_many
from django_jobs.context import JobContext
from django_jobs.exceptions import RunNotFound, SyncOnlyCall, UnknownJobType
from django_jobs.models import JobRun, Status
from django_jobs.registry import all_handlers, unregister
from tests.testapp.jobs import noop

pytestmark = pytest.mark.django_db


def test_job_takes_an_async_def_handler() -> None:
    @job("tests.async_handler")
    async def handler(ctx: JobContext) -> None:
        pass

    try:
        assert all_handlers()["tests.async_handler"].is_async
    finally:
        unregister("tests.async_handler")


def test_job_refuses_an_async_generator() -> None:
    async def handler(ctx: JobContext) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(TypeError, match="a generator function"):
        job("tests.async_generator")(handler)
    assert "tests.async_generator" not in all_handlers()


def in_event_loop(call: Callable[[], Any]) -> None:
    async def main() -> None:
        call()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: start("tests.noop"), "start"),
        (lambda: noop.start(), "start"),
        (lambda: start_many("tests.noop", [{}, {}]), "start_many"),
    ],
)
def test_start_from_async_code_names_sync_to_async(
    call: Callable[[], Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    with pytest.raises(SyncOnlyCall) as caught:
        in_event_loop(call)
    assert isinstance(caught.value, SynchronousOnlyOperation)  # Django's class for this
    assert f"django_jobs.{name}() was called from async code" in str(caught.value)
    assert f"await django_jobs.a{name}(...)" in str(caught.value)
    assert not JobRun.objects.exists()


# --- the async forms -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_async_forms_start_cancel_and_retry_from_an_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)

    async def main() -> tuple[Any, ...]:
        one = await astart("tests.noop", {"n": 1}, pool="mail", idempotency_key="k")
        again = await astart("tests.noop", {"n": 2}, pool="mail", idempotency_key="k")
        many = await astart_many("tests.noop", ({"n": n} for n in range(3)), priority=5)
        mine = await noop.astart({"n": 9})
        theirs = await noop.astart_many([{}, {}])
        canceled = await acancel(many[0].pk, reason="not needed")
        return one, again, many, mine, theirs, canceled

    one, again, many, mine, theirs, canceled = asyncio.run(main())
    assert again.pk == one.pk
    assert one.pool == "mail"
    assert [run.input for run in many] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert {run.priority for run in many} == {5}
    assert mine.job_type == theirs[0].job_type == "tests.noop"
    assert canceled == 1
    assert JobRun.objects.get(pk=many[0].pk).status == Status.CANCELED
    retried = asyncio.run(aretry(many[0].pk))
    assert retried.status == Status.PENDING
    assert JobRun.objects.count() == 7


@pytest.mark.django_db(transaction=True)
def test_astart_joins_a_transaction_of_the_sync_code_that_awaits_it() -> None:
    # As in a sync view that runs async code with async_to_sync: astart's work runs
    # on this thread, on its connection, inside its transaction.
    with transaction.atomic():
        run = async_to_sync(astart)("tests.noop")
        assert JobRun.objects.filter(pk=run.pk).exists()
        transaction.set_rollback(True)
    assert not JobRun.objects.filter(pk=run.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_async_forms_raise_what_the_sync_ones_raise() -> None:
    with pytest.raises(UnknownJobType):
        asyncio.run(astart("tests.no_such_job"))
    with pytest.raises(RunNotFound):
        asyncio.run(acancel(10**9))
