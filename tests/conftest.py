"""Fixtures shared by the suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import WorkerProcess, worker_env


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
