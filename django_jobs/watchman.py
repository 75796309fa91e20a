"""A worker's watchman: keeps its heartbeat while a C call holds the GIL.

The heartbeat is a thread of the worker's process, so one C call that holds
the GIL for longer than ``STALE_THRESHOLD`` (image processing, a huge regex, a
big-number ``pow``) stops it, and the worker's runs would be rescued while they
still run. The watchman is a small process of its own, started by
``runjobworker``, that the GIL cannot stop:

* the worker's heartbeat thread writes a pulse to the watchman's stdin at every
  beat (a line: how long its running runs may still take, ``inf`` when one has
  no timeout);
* while pulses come, the watchman does nothing and holds no connection;
* once they stop, it looks at the worker process: if it is alive and its CPU
  time advances (it executes), it writes the heartbeat in its stead, until the
  pulses resume or the running runs' timeouts (plus ``STALE_THRESHOLD``) have
  passed; a process that is stopped, or blocked without consuming CPU, gets no
  heartbeat from it and is rescued as before;
* when the worker process dies, its end of the pipe closes and the watchman exits.

Linux only (it reads ``/proc``); elsewhere the worker runs without one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

logger = logging.getLogger("django_jobs.watchman")  # also when run as __main__


def supported() -> bool:
    return sys.platform.startswith("linux") and Path(f"/proc/{os.getpid()}/stat").exists()


class Watchman:
    """The worker's side: start the watchman process, pulse it, stop it."""

    def __init__(self, worker_id: uuid.UUID, alias: str, interval: float, stale: float) -> None:
        from django.db import connections

        database = {
            key: value
            for key, value in connections[alias].settings_dict.items()
            if key in {"NAME", "USER", "PASSWORD", "HOST", "PORT"}
        }
        config = {
            "ppid": os.getpid(),
            "worker_id": str(worker_id),
            "alias": alias,
            "database": database,  # the resolved one (a test database, say)
            "interval": interval,
            "stale": stale,
        }
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "django_jobs.watchman"],
            stdin=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert self._proc.stdin is not None
        self._fd = self._proc.stdin.fileno()
        self._lock = threading.Lock()
        # The configuration goes through the pipe, not argv: it holds a password.
        self._send(json.dumps(config))
        os.set_blocking(self._fd, False)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def pulse(self, remaining: float) -> None:
        """Tell the watchman the heartbeat thread runs; ``remaining``: seconds the
        running runs may still take by their timeouts (``math.inf`` if unbounded)."""
        self._send("inf" if math.isinf(remaining) else f"{max(remaining, 0.0):.3f}")

    def stop(self) -> None:
        with self._lock:
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)

    def _send(self, line: str) -> None:
        data = (line + "\n").encode()
        # A full pipe means the watchman lags; a broken one that it is gone.
        # Either way the heartbeat thread itself goes on.
        with self._lock, contextlib.suppress(OSError):
            os.write(self._fd, data)


# --- the watchman process ---------------------------------------------------------------


def cpu_ticks(pid: int) -> int | None:
    """The CPU time (user + system, in clock ticks) of a running process; None
    if it is gone, a zombie or stopped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain anything.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in {"Z", "X", "T", "t"}:
        return None
    return int(fields[11]) + int(fields[12])


class Watch:
    """The watchman's decisions, apart from its I/O (so they can be tested)."""

    def __init__(self, interval: float, stale: float, now: float) -> None:
        self.interval = interval
        self.stale = stale
        self.last_pulse = now
        self.cover_until = math.inf
        self.last_ticks: int | None = None
        self.last_beat = 0.0

    def pulsed(self, line: str, now: float) -> None:
        self.last_pulse = now
        try:
            remaining = float(line)
        except ValueError:
            remaining = math.inf
        self.cover_until = now + remaining + self.stale if remaining == remaining else math.inf

    def should_beat(self, ticks: int | None, now: float) -> bool:
        """Whether to write the heartbeat now in the worker's stead."""
        advanced = ticks is not None and self.last_ticks is not None and ticks > self.last_ticks
        self.last_ticks = ticks
        starved = now - self.last_pulse > 1.5 * self.interval
        if not (starved and advanced and now < self.cover_until):
            return False
        if now - self.last_beat < self.interval:
            return False
        self.last_beat = now
        return True


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the worker
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the worker's drain ends us (EOF)
    stdin = sys.stdin.buffer
    first = stdin.readline()
    if not first:
        return
    config = json.loads(first)
    import django
    from django.conf import settings

    ppid, alias, worker_id = int(config["ppid"]), config["alias"], config["worker_id"]
    settings.DATABASES[alias].update(config["database"])
    django.setup()
    from django.db import DatabaseError, connections

    from django_jobs.logstream import write_worker_log

    write_worker_log(sys.stderr)  # as runjobworker does

    from django.db.models.functions import Now

    from django_jobs.models import Worker, WorkerStatus

    def beat() -> None:
        try:
            Worker.objects.using(alias).filter(
                pk=worker_id, status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING]
            ).update(heartbeat_at=Now())
        except DatabaseError as exc:
            logger.warning("worker=%s watchman could not write the heartbeat: %s", worker_id, exc)
            connections[alias].close()

    watch = Watch(float(config["interval"]), float(config["stale"]), time.monotonic())
    period = min(watch.interval / 2, 1.0)
    fd = stdin.fileno()
    buffer = b""
    covering = False
    while True:
        ready, _, _ = select.select([fd], [], [], period)
        now = time.monotonic()
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return  # the worker process is gone, or stopped us
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if lines:
                watch.pulsed(lines[-1].decode(errors="replace"), now)
        if os.getppid() != ppid:
            return
        if watch.should_beat(cpu_ticks(ppid), now):
            if not covering:
                logger.warning(
                    "worker=%s heartbeat thread silent for %.0fs while its process executes "
                    "(a C call holding the GIL?); the watchman keeps its heartbeat",
                    worker_id,
                    now - watch.last_pulse,
                )
                covering = True
            beat()
        elif covering and now - watch.last_pulse <= 1.5 * watch.interval:
            covering = False
            connections[alias].close()  # hold no connection while the worker beats itself


if __name__ == "__main__":
    main()
