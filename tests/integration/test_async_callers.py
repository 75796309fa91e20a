"""Async code is told, at once and by name, what the synchronous API and @job cannot do yet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from django.core.exceptions import SynchronousOnlyOperation

from django_jobs import job, start, start_many
from django_jobs.context import JobContext
from django_jobs.exceptions import SyncOnlyCall
from django_jobs.models import JobRun
from django_jobs.registry import all_handlers
from tests.testapp.jobs import noop

pytestmark = pytest.mark.django_db


def test_job_refuses_an_async_def_handler_when_it_is_defined() -> None:
    with pytest.raises(TypeError, match="async def function") as caught:

        @job("tests.async_handler")
        async def handler(ctx: JobContext) -> None:
            pass

    assert "async_to_sync" in str(caught.value)
    assert "tests.async_handler" not in all_handlers()


def test_job_refuses_an_async_generator_too() -> None:
    async def handler(ctx: JobContext) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(TypeError, match="async handlers are not supported yet"):
        job("tests.async_generator")(handler)


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
    assert f"await sync_to_async({name})(...)" in str(caught.value)
    assert not JobRun.objects.exists()
