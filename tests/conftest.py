"""Fixtures shared by the suite."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from tests.helpers import WorkerProcess, worker_env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests of PostgreSQL's own features where the suite runs on another database."""
    from django.db import connection

    if connection.vendor == "postgresql":
        return
    for item in items:
        marker = item.get_closest_marker("postgresql")
        if marker is not None:
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.skip(reason=f"PostgreSQL only: {reason}"))


@pytest.fixture(autouse=True)
def close_async_connections() -> Iterator[None]:
    """Close the connections of asgiref's thread for sync work after each test.

    ``astart()`` and the other a-forms, like Django's async ORM, run there; from
    ``asyncio.run()`` in a test (not a request, whose end closes them) its
    connection would outlive the test, and the test database could not be dropped.
    """
    yield
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runjobworker`` subprocesses; every one is killed at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess(list(args), log, worker_env(**env))
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(params=["one statement", "two statements"])
def claim_forms(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both forms of the claim: the vendor's one statement (PostgreSQL), and the
    two statements every database has."""
    from django_jobs.storage import vendors

    if request.param == "two statements":
        monkeypatch.setattr(type(vendors.of(connection)), "claim", lambda *args, **kw: None)
    elif connection.vendor != "postgresql":
        pytest.skip("PostgreSQL alone claims in one statement")
    return str(request.param)
