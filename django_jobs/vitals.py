"""A worker's vital signs: its heartbeat and its watchdog, on threads of their own.

The heartbeat records liveness and nothing else (and pulses the watchman); the
watchdog enforces timeouts and cancel grace, wakes sleepers, rescues silent
workers' runs and makes the passes over held runs. Both share the worker's
control connection, one operation at a time. ``JobWorker`` (worker.py) is built
on this class; it is not used alone.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, connections

from . import conf, overdue, transitions, watchman
from .attempt import Attempt
from .models import WorkerStatus
from .ratelimits import Limits
from .registry import all_handlers
from .storage import upkeep, workers
from .storage.connections import discard_broken_connections
from .storage.control import ControlConnection
from .watchman import Watchman

logger = logging.getLogger("django_jobs.worker")
T = TypeVar("T")


class Vitals:
    """The heartbeat and watchdog loops of ``JobWorker``, and the helpers that run
    an operation on its control connection."""

    # Set by JobWorker.__init__ (and _register).
    pools: list[str]
    limits: Limits
    worker_id: uuid.UUID | None
    watchman: bool
    heartbeat_interval: float
    stale_threshold: float
    cancel_grace: float
    tick: float
    stopping: threading.Event
    hard_stop: threading.Event
    _slots: threading.Condition
    _in_flight: set[Attempt]
    _control: ControlConnection | None
    _watchman: Watchman | None = None
    _beat_aside = False  # a heartbeat had to be written apart (logged once)

    if TYPE_CHECKING:  # JobWorker's

        def _register(self) -> None: ...

        def _news(self) -> None: ...

    # --- the watchman ---------------------------------------------------------------

    def _start_watchman(self) -> None:
        if not self.watchman:
            return
        if not watchman.supported():
            logger.info("worker=%s runs without a watchman (Linux only)", self.worker_id)
            return
        if not os.environ.get("DJANGO_SETTINGS_MODULE"):
            # Settings configured in code: a new process could not load them.
            logger.info(
                "worker=%s runs without a watchman (no DJANGO_SETTINGS_MODULE)", self.worker_id
            )
            return
        try:
            self._watchman = watchman.Watchman(
                self.worker_id,  # type: ignore[arg-type]
                conf.get().DATABASE,
                self.heartbeat_interval,
                self.stale_threshold,
            )
        except OSError as exc:
            logger.warning("worker=%s watchman not started: %s", self.worker_id, exc)

    def _pulse(self) -> None:
        """Tell the watchman this thread runs, and how long the running runs may take."""
        if self._watchman is None:
            return
        now = time.monotonic()
        remaining = [
            math.inf if attempt.deadline is None else attempt.deadline - now
            for attempt in self._snapshot()
        ]
        self._watchman.pulse(max(remaining, default=math.inf))

    # --- heartbeat, rescue and the watchdog ---------------------------------------

    def _heartbeat_loop(self) -> None:
        """Record liveness, and nothing else: on its own thread, so no slow sweep of
        the watchdog's can delay it and get this worker taken for dead. It takes the
        shared control connection for each beat; no operation holds that long."""
        self._adopt()
        while True:
            status = WorkerStatus.STOPPING if self.stopping.is_set() else WorkerStatus.RUNNING
            if self._beat(status) is False:
                # The row was deleted (by hand, or by retention): recreate it, so
                # claims by this worker satisfy the foreign key again.
                logger.warning("worker=%s row missing; registering again", self.worker_id)
                self._quietly(self._register)
            # After the beat: a pulse tells the watchman the heartbeat was just
            # written. A beat held up (by a control thread that a C call holding
            # the GIL stopped mid-operation) holds up the pulse too, so the
            # watchman's cover starts from the last heartbeat written.
            self._pulse()
            if self.hard_stop.wait(self.heartbeat_interval):
                break
        self._leave()

    def _beat(self, status: str) -> bool | None:
        """Write the heartbeat on the shared connection, or, when an operation has
        held that for half a heartbeat interval (a slow signal receiver), on a
        connection of its own for this beat."""
        control = self._control
        if control is None or control.enter(timeout=self.heartbeat_interval / 2):
            self._beat_aside = False
            try:
                return self._logged(workers.heartbeat, self.worker_id, status)
            finally:
                if control is not None:
                    control.__exit__(None, None, None)
        if not self._beat_aside:
            logger.warning(
                "worker=%s the control connection was busy for %.1fs; the heartbeat is "
                "written on a connection of its own while it stays busy (a slow signal "
                "receiver?)",
                self.worker_id,
                self.heartbeat_interval / 2,
            )
        self._beat_aside = True
        with control.aside():
            return self._logged(workers.heartbeat, self.worker_id, status)

    def _watchdog_loop(self) -> None:
        """Every tick: enforce timeouts and cancel grace, wake sleepers, hold and
        release runs (``storage.upkeep``); every heartbeat interval also: rescue
        stale workers' runs, poll cancel requests, release stranded held runs."""
        self._adopt()
        next_sweep = 0.0
        while True:
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.heartbeat_interval
                self._quietly(self._rescue)
                self._quietly(self._poll_cancel_requests)
                sweep = (self.pools, self.limits, all_handlers(tasks=True), self.tick)
                if self._quietly(upkeep.every_sweep, *sweep):
                    self._news()
            self._quietly(self._enforce_deadlines)
            if self._quietly(transitions.wake_sleepers):
                self._news()
            if self._quietly(upkeep.every_tick, self.pools, self.limits, self.tick):
                self._news()
            if self.hard_stop.wait(self.tick):
                break
        self._leave()

    def _rescue(self) -> None:
        requeued, failed = transitions.rescue_stale(self.pools, self.stale_threshold)
        if requeued or failed:
            logger.warning(
                "worker=%s rescued runs of stale workers requeued=%d failed=%d",
                self.worker_id,
                requeued,
                failed,
            )
            self._news()

    def _snapshot(self) -> list[Attempt]:
        with self._slots:
            return list(self._in_flight)

    def _poll_cancel_requests(self) -> None:
        overdue.notice_cancel_requests(self._snapshot())

    def _enforce_deadlines(self) -> None:
        overdue.end_overdue(self._snapshot(), self.cancel_grace, self.hard_stop)

    # --- the control connection ---------------------------------------------------

    def _shared(self) -> AbstractContextManager[object]:
        """The control connection, held for one operation (see storage/control.py)."""
        return self._control if self._control is not None else nullcontext()

    def _adopt(self) -> None:
        if self._control is not None:
            self._control.adopt()

    def _leave(self) -> None:
        if self._control is not None:
            self._control.leave()
        else:
            connections.close_all()

    def _quietly(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Call ``fn(*args)`` on the control connection; log a database error
        instead of raising (the loop goes on)."""
        with self._shared():
            return self._logged(fn, *args)

    def _logged(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Call ``fn(*args)`` on this thread's connection as it is; log a database
        error instead of raising."""
        try:
            return fn(*args)
        except DatabaseError as exc:
            logger.warning("worker=%s database error: %s", self.worker_id, exc)
            discard_broken_connections()
            return None
