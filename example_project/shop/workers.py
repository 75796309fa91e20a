"""Start ``runjobworker`` subprocesses for the demo, and make sure they stop."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)


class WorkerProcesses:
    """A group of ``manage.py runjobworker --burst`` processes sharing the same flags."""

    def __init__(
        self,
        manage_py: Path,
        pools: Sequence[str],
        *,
        processes: int,
        concurrency: int,
        verbosity: int = 0,
    ) -> None:
        self.command = [sys.executable, str(manage_py), "runjobworker"]
        for pool in pools:
            self.command += ["--pool", pool]
        self.command += ["--concurrency", str(concurrency), "--burst", "-v", str(verbosity)]
        self.processes = processes
        self.running: list[subprocess.Popen[bytes]] = []
        self.exit_codes: list[int] = []

    def start(self) -> None:
        """Start the processes; they inherit the environment, DATABASE_URL included."""
        for _ in range(self.processes):
            process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, env=os.environ.copy()
            )
            logger.info("started worker pid=%s", process.pid)
            self.running.append(process)

    def reap(self) -> bool:
        """Collect the exit codes of processes that ended; return True when none is left."""
        for process in list(self.running):
            code = process.poll()
            if code is not None:
                self.running.remove(process)
                self.exit_codes.append(code)
        return not self.running

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every process to end; True when they did."""
        for process in self.running:
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
        return self.reap()

    def stop(self, grace: float = 10.0) -> None:
        """End what still runs: SIGTERM (the worker drains), then SIGKILL after ``grace``."""
        for process in self.running:
            if process.poll() is None:
                logger.warning("stopping worker pid=%s", process.pid)
                process.terminate()
        for process in self.running:
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                logger.warning("killing worker pid=%s", process.pid)
                process.kill()
                process.wait()
        self.reap()

    @property
    def failed(self) -> bool:
        return any(code != 0 for code in self.exit_codes)
