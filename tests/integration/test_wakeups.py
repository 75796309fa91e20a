"""LISTEN/NOTIFY wake-ups, with polling behind them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_jobs import start, start_many
from django_jobs.models import JobRun, Status
from django_jobs.storage import notify
from django_jobs.storage.control import ControlConnection
from django_jobs.storage.notify import CHANNEL, Listener, raw_connection_params
from django_jobs.worker import JobWorker
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def listening() -> psycopg.Connection[Any]:
    conn = psycopg.connect(**raw_connection_params(), autocommit=True)
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def payloads(conn: psycopg.Connection[Any]) -> list[str]:
    return [note.payload for note in conn.notifies(timeout=0.5)]


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_an_insert_notifies_its_pools_at_commit_only() -> None:
    with listening() as conn:
        with transaction.atomic():
            start("tests.echo", {})
            start("tests.noop")
            assert payloads(conn) == []  # not before the commit
        assert sorted(payloads(conn)) == ["default", "echo"]
        start_many("tests.noop", [{}, {}, {}])
        assert payloads(conn) == ["default"]  # once per statement and pool


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_a_rolled_back_or_future_run_sends_nothing() -> None:
    from datetime import timedelta

    with listening() as conn:
        try:
            with transaction.atomic():
                start("tests.noop")
                raise RuntimeError
        except RuntimeError:
            pass
        start("tests.noop", delay=timedelta(hours=1))
        assert payloads(conn) == []


@pytest.fixture
def control() -> Iterator[ControlConnection]:
    """The test thread's connection, shared as a worker shares its own."""
    shared = ControlConnection(connection.alias)
    yield shared
    shared.release()


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_the_listener_wakes_the_worker_for_its_pools(control: ControlConnection) -> None:
    woken = threading.Event()
    stop = threading.Event()
    listener = Listener(["echo"], woken.set, stop, control)
    listener.start()
    try:
        assert listener.connected.wait(10)
        woken.clear()
        start("tests.noop")  # another pool
        assert not woken.wait(1.0)
        start("tests.echo", {})
        assert woken.wait(10)
    finally:
        stop.set()
        listener.join(5)


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_a_listener_whose_connection_is_killed_reconnects(control: ControlConnection) -> None:
    woken = threading.Event()
    stop = threading.Event()
    listener = Listener(["default"], woken.set, stop, control)
    listener.start()
    try:
        assert listener.connected.wait(10)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %%' "
                "AND pid <> pg_backend_pid()"
            )
        wait_until(lambda: not listener.connected.is_set(), timeout=10)
        wait_until(listener.connected.is_set, timeout=20)
        woken.clear()
        start("tests.noop")
        assert woken.wait(10)
    finally:
        stop.set()
        listener.join(5)


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_a_worker_with_a_long_poll_interval_is_woken_by_notify(settings: Any) -> None:
    from django_jobs.worker import JobWorker

    worker = JobWorker(["default"], poll_interval=60)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: worker.worker_id is not None, timeout=10)
        wait_until(lambda: worker.claimed == 0 and worker.wake.is_set() is False, timeout=10)
        run = start("tests.noop")
        # Without the notification this would wait for the 60 s poll.
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED, timeout=20)
    finally:
        worker.request_stop()
        thread.join(30)


def test_with_listen_notify_off_the_worker_polls(settings: Any) -> None:
    from django_jobs.worker import JobWorker

    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "LISTEN_NOTIFY": False}
    assert not Listener.enabled()
    worker = JobWorker(["default"], poll_interval=0.2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        run = start("tests.noop")
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED, timeout=20)
    finally:
        worker.request_stop()
        thread.join(30)


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_a_notification_lost_while_the_listener_is_down_is_covered_by_polling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = JobWorker(["default"], poll_interval=0.5)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: listeners() == 1, timeout=10)
        # From now on the listener cannot reconnect: every notification is lost.
        real = notify.raw_connection_params
        monkeypatch.setattr(notify, "raw_connection_params", lambda: {**real(), "port": 1})
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %%' "
                "AND pid <> pg_backend_pid()"
            )
        wait_until(lambda: listeners() == 0, timeout=10)
        run = start("tests.noop")
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == Status.COMPLETED, timeout=20)
        assert listeners() == 0
    finally:
        worker.request_stop()
        thread.join(30)
        connections.close_all()


def listeners() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%' "
            "AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])
