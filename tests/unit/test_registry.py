from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from django_jobs import RetryPolicy, job
from django_jobs.exceptions import DuplicateJobType, UnknownJobType
from django_jobs.registry import JobHandler, all_handlers, get_handler, unregister


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        unregister(name)


def test_decorator_registers_handler_with_options(cleanup: list[str]) -> None:
    cleanup.append("unit.options")
    policy = RetryPolicy(attempts=4)

    @job("unit.options", pool="mail", retry=policy, timeout=timedelta(minutes=2), priority=5)
    def handler(ctx: object) -> str:
        return "ok"

    assert isinstance(handler, JobHandler)
    assert get_handler("unit.options") is handler
    assert (handler.pool, handler.retry, handler.timeout, handler.priority) == (
        "mail",
        policy,
        120.0,
        5,
    )
    assert handler(None) == "ok"  # type: ignore[arg-type]
    assert callable(handler.start)


def test_second_handler_for_a_type_is_an_error(cleanup: list[str]) -> None:
    cleanup.append("unit.dup")

    @job("unit.dup")
    def first(ctx: object) -> None: ...

    with pytest.raises(DuplicateJobType, match=r"unit\.dup"):

        @job("unit.dup")
        def second(ctx: object) -> None: ...


def test_same_function_registered_again_replaces_entry(cleanup: list[str]) -> None:
    cleanup.append("unit.again")

    def handler(ctx: object) -> None: ...

    job("unit.again")(handler)
    job("unit.again", pool="other")(handler)
    assert get_handler("unit.again").pool == "other"


def test_unknown_job_type_names_the_type() -> None:
    with pytest.raises(UnknownJobType, match=r"'nope\.never'"):
        get_handler("nope.never")


def test_unhashable_job_type_is_unknown() -> None:
    with pytest.raises(UnknownJobType):
        get_handler(["a list"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"pool": ""}, {"retry": 3}, {"concurrency_key": 42}, {"timeout": 0}],
)
def test_bad_decorator_options_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError)):
        job("unit.bad", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("job_type", ["", None, 42])
def test_job_type_must_be_a_string(job_type: object) -> None:
    with pytest.raises(TypeError):
        job(job_type)  # type: ignore[arg-type]


def test_installed_apps_jobs_modules_are_discovered() -> None:
    assert "tests.noop" in all_handlers()
    assert get_handler("tests.echo").pool == "echo"
