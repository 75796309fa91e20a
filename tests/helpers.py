"""Helpers for tests: worker subprocesses, threads, polling, admin clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import DatabaseError, connection, connections
from django.test import Client

from django_jobs.models import JobRun, Worker, WorkerStatus

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """A real ``manage.py runjobworker`` subprocess on the test database."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runjobworker", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log_file.flush()

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log_file.close()


def worker_env(**overrides: str) -> dict[str, str]:
    """The environment for a subprocess that must use this test run's database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["DJANGO_JOBS_USE_DB"] = connection.settings_dict["NAME"]
    env["PYTHONPATH"] = str(ROOT)
    env.update(overrides)
    return env


def on_server(sql: str) -> None:
    """Run ``sql`` (CREATE or DROP DATABASE) on the suite's server, outside any transaction."""
    from urllib.parse import unquote, urlsplit

    url = urlsplit(os.environ["DATABASE_URL"])  # tests/settings.py exports it
    if url.scheme.startswith(("mysql", "mariadb")):
        import MySQLdb

        server = MySQLdb.connect(
            host=url.hostname or "127.0.0.1",
            port=url.port or 3306,
            user=unquote(url.username or "root"),
            password=unquote(url.password or ""),
        )
        try:
            server.cursor().execute(sql.replace('"', "`").replace(" WITH (FORCE)", ""))
        finally:
            server.close()
        return
    import psycopg

    with psycopg.connect(url.geturl(), autocommit=True) as server:
        server.execute(sql)


def wait_until(predicate: Callable[[], bool], timeout: float = 30, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(interval)


def all_running(
    start_worker: Callable[..., WorkerProcess], count: int, *args: str
) -> list[WorkerProcess]:
    """Start ``count`` workers (not ``--burst``) and return once every one is running:
    a test that asks that each of them took part starts its runs after this (on a
    loaded machine, start-ups stagger by seconds, and the first drains alone)."""
    workers = [start_worker(*args) for _ in range(count)]
    wait_until(
        lambda: Worker.objects.filter(status=WorkerStatus.RUNNING).count() == count, timeout=120
    )
    return workers


def stop_all(workers: list[WorkerProcess]) -> None:
    """SIGTERM every worker and check that each drained and exited 0."""
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.output()


def lock_waiters() -> int:
    """How many sessions of the test database wait on a lock right now."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            # The sessions in the middle of a statement: InnoDB reports a lock wait
            # (innodb_trx) only some seconds after it began.
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist "
                "WHERE db = DATABASE() AND command = 'Query' AND id <> CONNECTION_ID()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        return int(cursor.fetchone()[0])


def terminate_other_connections() -> int:
    """End every session of the test database but this one; return how many."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            ended = 0
            for (session,) in cursor.fetchall():
                try:
                    cursor.execute(f"KILL CONNECTION {int(session)}")
                    ended += 1
                except DatabaseError:
                    pass  # it ended meanwhile
            return ended
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def status_of(run: JobRun) -> str:
    return str(JobRun.objects.values_list("status", flat=True).get(pk=run.pk))


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on its own thread (so on its own database connection)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def operator() -> Client:
    user = User.objects.create_user("review-op", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_jobrun", "retry_jobrun"])
    )
    client = Client()
    client.force_login(user)
    return client
