from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobs import conf, start, start_many
from django_jobs.exceptions import InvalidJobInput, UnknownJobType
from django_jobs.models import JobRun, Status
from tests.testapp.jobs import echo, flaky

pytestmark = pytest.mark.django_db


def test_start_stores_a_pending_run_with_handler_defaults() -> None:
    run = start("tests.flaky", {"succeed_on": 2})
    run.refresh_from_db()
    assert run.status == Status.PENDING
    assert (run.job_type, run.pool, run.priority, run.attempts) == ("tests.flaky", "default", 0, 0)
    assert run.max_attempts == 3
    assert run.input == {"succeed_on": 2}
    assert run.run_at is not None
    assert run.run_at <= timezone.now()
    assert run.created_at is not None


def test_handler_start_uses_its_pool() -> None:
    run = echo.start({"x": 1})
    assert run.pool == "echo"
    assert run.job_type == "tests.echo"


def test_input_is_normalised_once_at_enqueue() -> None:
    when = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC)
    run = start("tests.echo", {"when": when, "ids": (1, 2)})
    assert run.input == {"when": "2026-05-01T12:00:00Z", "ids": [1, 2]}
    assert JobRun.objects.get(pk=run.pk).input == run.input


def test_no_input_means_an_empty_object() -> None:
    assert start("tests.noop").input == {}


def test_start_joins_the_callers_transaction() -> None:
    def enqueue_then_fail() -> None:
        with transaction.atomic():
            start("tests.noop")
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not JobRun.objects.exists()


def test_options_are_stored() -> None:
    when = timezone.now() + datetime.timedelta(hours=1)
    run = start(
        "tests.noop",
        pool="other",
        priority=-5,
        run_at=when,
        concurrency_key="k",
        tags=["a", "b"],
        tenant_id="acme",
    )
    run.refresh_from_db()
    assert (run.pool, run.priority, run.run_at, run.concurrency_key) == ("other", -5, when, "k")
    assert (run.tags, run.tenant_id) == (["a", "b"], "acme")


def test_delay_schedules_later() -> None:
    before = timezone.now()
    run = start("tests.noop", delay=datetime.timedelta(minutes=5))
    assert run.run_at >= before + datetime.timedelta(minutes=5)


def test_parent_sets_root_and_tenant() -> None:
    grandparent = start("tests.noop", tenant_id="acme")
    parent = start("tests.noop", parent=grandparent)
    child = start("tests.noop", parent=parent.pk)
    assert (child.parent_id, child.root_id, child.tenant_id) == (parent.pk, grandparent.pk, "acme")
    assert (child.trigger_source, child.trigger_ref) == ("child", str(parent.pk))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("nope.never", {}), {}, UnknownJobType, "nope.never"),
        ((42, {}), {}, UnknownJobType, "42"),
        (("tests.noop", {"x": object()}), {}, InvalidJobInput, "not JSON"),
        (("tests.noop", {"x": "\x00"}), {}, InvalidJobInput, "NUL"),
        (("tests.noop", {}), {"priority": 40_000}, InvalidJobInput, "priority"),
        (("tests.noop", {}), {"priority": "high"}, InvalidJobInput, "priority"),
        (("tests.noop", {}), {"run_at": datetime.datetime(2030, 1, 1)}, InvalidJobInput, "naive"),
        (("tests.noop", {}), {"run_at": "tomorrow"}, InvalidJobInput, "datetime"),
        (("tests.noop", {}), {"delay": -1}, InvalidJobInput, "delay"),
        (("tests.noop", {}), {"delay": 1, "run_at": timezone.now()}, InvalidJobInput, "not both"),
        (("tests.noop", {}), {"pool": ""}, InvalidJobInput, "pool"),
        (("tests.noop", {}), {"pool": "p" * 101}, InvalidJobInput, "pool"),
        (("tests.noop", {}), {"tags": "urgent"}, InvalidJobInput, "tags"),
        (("tests.noop", {}), {"tenant_id": 7}, InvalidJobInput, "tenant_id"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        start(*args, **kwargs)
    assert not JobRun.objects.exists()


def test_sql_looking_text_is_stored_verbatim() -> None:
    text = "'); DROP TABLE django_jobs_jobrun; --"
    run = start("tests.echo", {"q": text}, tags=[text], tenant_id=text[:50])
    run.refresh_from_db()
    assert run.input == {"q": text}
    assert run.tags == [text]


def test_idempotency_key_returns_the_existing_run() -> None:
    first = start("tests.noop", {"n": 1}, idempotency_key="order-42")
    second = start("tests.noop", {"n": 2}, idempotency_key="order-42")
    assert second.pk == first.pk
    assert second.input == {"n": 1}
    other_type = start("tests.record", idempotency_key="order-42")
    assert other_type.pk != first.pk


def test_duplicate_idempotency_key_keeps_the_callers_transaction_usable() -> None:
    with transaction.atomic():
        first = start("tests.noop", idempotency_key="k")
        again = start("tests.noop", idempotency_key="k")
        later = start("tests.noop")
    assert again.pk == first.pk
    assert JobRun.objects.filter(pk=later.pk).exists()


def test_start_many_is_one_insert(django_assert_num_queries: Any) -> None:
    # One query reads the turn the runs take (storage.turns), one inserts them. On
    # PostgreSQL the first is a prepared statement, sent past Django's query log.
    prepared = connection.vendor == "postgresql" and conf.get().PREPARED_STATEMENTS
    with django_assert_num_queries(1 if prepared else 2):
        runs = start_many("tests.echo", [{"i": i} for i in range(50)], priority=3)
    assert len(runs) == 50
    assert all(run.pk is not None and run.run_at is not None for run in runs)
    assert JobRun.objects.filter(priority=3, pool="echo").count() == 50


def test_start_many_validates_every_input_before_writing() -> None:
    with pytest.raises(InvalidJobInput):
        start_many("tests.echo", [{"i": 1}, {"i": object()}])
    assert not JobRun.objects.exists()


def test_start_many_refuses_idempotency_keys() -> None:
    with pytest.raises(TypeError, match="idempotency_key"):
        start_many("tests.noop", [{}], idempotency_key="k")


def test_start_many_of_nothing_writes_nothing() -> None:
    assert start_many("tests.noop", []) == []
    assert flaky.start_many([{}, {}])[0].max_attempts == 3


def _as_stored(run: JobRun) -> dict[str, Any]:
    return {field.attname: getattr(run, field.attname) for field in JobRun._meta.concrete_fields}


def test_start_many_returns_the_runs_as_stored() -> None:
    parent = start("tests.noop", tenant_id="acme")
    when = timezone.now() + datetime.timedelta(hours=1)
    inputs = [{"on": datetime.date(2026, 12, 2), "i": i} for i in range(3)]
    runs = start_many("tests.keyed", inputs, priority=-5, tags=["bulk"], parent=parent, run_at=when)
    assert [run.input for run in runs] == [{"on": "2026-12-02", "i": i} for i in range(3)]
    for run in runs:
        stored = JobRun.objects.get(pk=run.pk)
        assert _as_stored(run) == _as_stored(stored)
        assert (run.root_id, run.tenant_id, run.run_at) == (parent.pk, "acme", when)
        assert not run._state.adding
        assert run._state.db == "default"
    # Saved again, a returned run updates its row rather than inserting a second one.
    runs[0].priority = 7
    runs[0].save(update_fields=["priority"])
    assert JobRun.objects.get(pk=runs[0].pk).priority == 7


def test_start_many_takes_each_runs_key_from_its_input() -> None:
    runs = start_many("tests.keyed", [{"key": "a"}, {}, {"key": "b"}])
    assert [run.concurrency_key for run in runs] == ["a", None, "b"]
    assert list(JobRun.objects.order_by("id").values_list("concurrency_key", flat=True)) == [
        "a",
        None,
        "b",
    ]
    given = start_many("tests.keyed", [{"key": "a"}, {"key": "b"}], concurrency_key="all")
    assert {run.concurrency_key for run in given} == {"all"}


def test_start_many_refuses_a_bad_key_or_option_before_writing() -> None:
    with pytest.raises(InvalidJobInput, match="concurrency_key"):
        start_many("tests.keyed", [{"key": "a"}, {"key": 5}])
    with pytest.raises(InvalidJobInput, match="priority"):
        start_many("tests.noop", [{}], priority=10**6)
    with pytest.raises(InvalidJobInput, match="naive"):
        start_many("tests.noop", [{}], run_at=datetime.datetime(2026, 1, 1))
    assert not JobRun.objects.exists()


@pytest.mark.postgresql("the one-statement insert of start_many")
def test_start_many_builds_runs_through_init_when_init_signals_listen() -> None:
    from django.db.models.signals import post_init

    seen: list[int | None] = []

    def listen(sender: type, instance: JobRun, **kwargs: Any) -> None:
        seen.append(instance.pk)

    post_init.connect(listen, sender=JobRun)
    try:
        runs = start_many("tests.noop", [{}, {}])
    finally:
        post_init.disconnect(listen, sender=JobRun)
    assert seen[-2:] == [run.pk for run in runs]


def test_start_many_stores_more_input_than_one_statement_may_carry() -> None:
    # 20 inputs of nearly 1 MiB: more than MariaDB's largest statement (16 MiB).
    inputs = [{"blob": f"{n:02}" + "x" * 1_000_000} for n in range(20)]
    runs = start_many("tests.noop", inputs)
    assert len({run.pk for run in runs}) == 20
    stored = JobRun.objects.filter(pk__in=[run.pk for run in runs]).order_by("pk")
    assert [run.input["blob"][:2] for run in stored] == [f"{n:02}" for n in range(20)]


@pytest.mark.parametrize("priority", [-32768, 32767])
def test_start_many_takes_the_lowest_and_the_highest_priority(priority: int) -> None:
    """PostgreSQL's one-statement insert binds on the client: "-32768::smallint" would
    read as -(32768::smallint), out of range."""
    runs = start_many("tests.noop", [{}] * 2, priority=priority)
    stored = JobRun.objects.filter(pk__in=[run.pk for run in runs])
    assert list(stored.values_list("priority", flat=True)) == [priority, priority]
