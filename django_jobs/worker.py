"""The worker loop: claim in batches, run in threads, heartbeat, rescue, drain.

No argparse and no printing here: ``runjobworker`` turns flags into a ``JobWorker``.
(``models.Worker`` is the row each live worker keeps.)
"""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from . import conf, ratelimits, transitions
from .attempt import Attempt
from .claimer import Claimer
from .completer import Completer
from .eventloop import DATABASE_THREADS, EventLoop
from .execution import Outcome, execute, record_handed_off
from .registry import all_handlers
from .retention import Pruner, describe_age
from .scheduler import Scheduler
from .storage import ratelimits as limited_runs
from .storage import vendors, workers
from .storage.claiming import Claim
from .storage.connections import discard_broken_connections, end_leaked_transactions
from .storage.control import ControlConnection
from .storage.notify import Listener, notify_pools
from .vitals import Vitals

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_RELEASED = 1  # the drain ran out of time (or a second signal came): runs were released
# Async runs a worker runs at once on its event loop unless told (see docs/decisions.md).
DEFAULT_ASYNC_CONCURRENCY = 100


class JobWorker(Vitals):
    """One worker process's engine. ``run()`` blocks until it stops and returns an exit code."""

    def __init__(
        self,
        pools: Sequence[str],
        *,
        concurrency: int = 1,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
        database_threads: int = DATABASE_THREADS,
        burst: bool = False,
        max_runs: int | None = None,
        poll_interval: float | None = None,
        scheduler: bool = True,
        watchman: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if async_concurrency < 0:
            raise ValueError(f"async_concurrency must be at least 0, got {async_concurrency}")
        if database_threads < 1:
            raise ValueError(f"database_threads must be at least 1, got {database_threads}")
        if not pools:
            raise ValueError("a worker needs at least one pool")
        self.pools = list(dict.fromkeys(pools))
        self.concurrency = concurrency
        # Async runs at once on the event loop; with none, async handlers run in
        # the threads (under async_to_sync), one per thread.
        self.async_concurrency = async_concurrency
        self.database_threads = database_threads  # the event loop's, with a connection each
        self.burst = burst
        self.max_runs = max_runs
        self.scheduler = scheduler  # fire the schedules of this worker's pools
        # Start a watchman process that keeps the heartbeat while a C call holds
        # the GIL (runjobworker does; a worker inside another program does not).
        self.watchman = watchman
        self._watchman = None
        settings = conf.get()
        if poll_interval is None:
            # Unset, the interval suits the database: longer where NOTIFY wakes idle workers.
            given = conf.is_given("POLL_INTERVAL")
            poll_interval = (
                settings.POLL_INTERVAL
                if given
                else vendors.of_alias(settings.DATABASE).poll_interval
            )
        self.poll_interval = poll_interval
        self.heartbeat_interval = settings.HEARTBEAT_INTERVAL
        self.stale_threshold = settings.STALE_THRESHOLD
        self.shutdown_timeout = settings.SHUTDOWN_TIMEOUT
        self.cancel_grace = settings.CANCEL_GRACE
        self.retention = settings.RETENTION  # seconds finished runs are kept; None: all
        # How often the watchdog checks timeouts and wakes sleeping runs.
        self.tick = min(0.5, self.heartbeat_interval)
        self.worker_id: uuid.UUID | None = None
        self.stopping = threading.Event()  # first signal: claim nothing more, drain
        self.hard_stop = threading.Event()  # second signal or drain timeout: give runs back
        # Set to make the claim loop look for due runs now (a notification, a
        # freed key) instead of after its poll interval.
        self.wake = threading.Event()
        self._slots = threading.Condition()
        # Keyed by attempt, not run id: a run fenced off while its handler still
        # runs can be claimed again here, and both hold a slot until they return.
        self._in_flight: set[Attempt] = set()
        self._queue: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()
        self._async_running = 0  # of _in_flight, the runs on the event loop
        self._event_loop: EventLoop | None = None  # started by the first async run
        # The rate limits enforced at claim: every registered job's, and this
        # worker's pools' own.
        self.limits = ratelimits.in_force(all_handlers(tasks=True), self.pools)
        # What to claim for the threads and the event loop, and when (claimer.py).
        self._claimer = Claimer(self.pools, self.limits, async_concurrency, poll_interval)
        self.claimed = 0
        self.finished = 0
        # Created by run(): the connection the control threads share.
        self._control: ControlConnection | None = None

    @property
    def control(self) -> ControlConnection | None:
        """The connection the control threads share (see storage/control.py); None
        until ``run()`` has made it."""
        return self._control

    # --- lifecycle ----------------------------------------------------------------

    def run(self) -> int:
        """Work until told to stop (or, in burst mode, until nothing is due).

        Raises ``WorkerRefused`` before anything starts when the database takes no
        more workers (SQLite: another worker process holds it).
        """
        alias = conf.get().DATABASE
        connection = connections[alias]
        vendor = vendors.of(connection)
        connection_created.connect(self._prepare)
        try:
            vendor.prepare(connection)  # connected before the signal was listened to
            leave = vendor.enter_worker(connection)
            try:
                return self._work()
            finally:
                leave()
        finally:
            connection_created.disconnect(self._prepare)

    def _prepare(self, sender: object, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        """Set up each connection this process opens to the jobs database."""
        if connection.alias == conf.get().DATABASE:
            vendors.of(connection).prepare(connection)

    def _work(self) -> int:
        # This thread's connection, shared by the control threads (see storage/control.py).
        # Row locks are waited for briefly on it, so that the heartbeat never waits long.
        control = self._control = ControlConnection(
            conf.get().DATABASE, lock_wait=min(1.0, self.heartbeat_interval / 2)
        )
        with control:
            self._register()
        try:
            self._start_watchman()
            # A worker holds --concurrency + 2 connections: the slots', the control
            # connection, and the listener's where the database wakes workers.
            # Elsewhere that one is the completer's, whose writes would otherwise
            # wait for the claims (several statements there) on the control one.
            listens = vendors.of_alias(conf.get().DATABASE).listens
            self._completer = Completer(
                record_handed_off,
                after_write=self._written,
                stop=self.hard_stop,
                control=control if listens else None,
            )
            threads = [
                start_thread(self._run_slot, f"django-jobs-slot-{i}")
                for i in range(self.concurrency)
            ]
            listener = None
            if Listener.enabled():
                listener = Listener(self.pools, self._news, self.hard_stop, control)
                listener.start()
            beat = start_thread(self._heartbeat_loop, "django-jobs-heartbeat")
            watchdog = start_thread(self._watchdog_loop, "django-jobs-watchdog")
            scheduling = self.start_scheduler()
            pruning = self.start_pruner()
        except BaseException:
            self._abort_start()
            raise
        logger.info(
            "worker=%s started pools=%s concurrency=%d async_concurrency=%d retention=%s",
            self.worker_id,
            ",".join(self.pools),
            self.concurrency,
            self.async_concurrency,
            describe_age(self.retention),
        )
        try:
            self._claim_loop()
            code = self._drain()
        finally:
            for _ in threads:
                self._queue.put(None)
            self.stopping.set()  # the scheduler's signal (a burst ends without one)
            self.hard_stop.set()
            beat.join(timeout=5)
            if self._watchman is not None:
                self._watchman.stop()
            watchdog.join(timeout=5)
            for housekeeping in (scheduling, pruning):
                if housekeeping is not None:
                    housekeeping.join(timeout=5)
            if listener is not None:
                listener.join(timeout=5)
            if self._event_loop is not None:
                self._event_loop.close()
            self._completer.close()
            self._quietly(workers.stop_worker, self.worker_id)
            control.release()
            connections.close_all()
        logger.info(
            "worker=%s stopped claimed=%d finished=%d exit=%d",
            self.worker_id,
            self.claimed,
            self.finished,
            code,
        )
        return code

    def _abort_start(self) -> None:
        """Undo a start that failed half-way (threads, listener): stop what started,
        and mark the Worker row stopped instead of leaving it "running"."""
        self.stopping.set()
        self.hard_stop.set()
        for _ in range(self.concurrency):
            self._queue.put(None)
        completer = getattr(self, "_completer", None)
        if completer is not None:
            completer.close()
        if self._watchman is not None:
            self._watchman.stop()
        self._quietly(workers.stop_worker, self.worker_id)
        if self._control is not None:
            self._control.release()
        logger.error("worker=%s could not start; marked stopped", self.worker_id)

    def _register(self) -> None:
        worker = workers.register_worker(
            socket.gethostname(), os.getpid(), self.pools, self.concurrency, self.worker_id
        )
        self.worker_id = self._claimer.worker_id = worker.pk

    def start_scheduler(self) -> threading.Thread | None:
        """Start the scheduler thread, if asked: schedules may be added at run time, so
        it runs even while this worker's pools have none."""
        if not self.scheduler:
            return None
        scheduler = Scheduler(self.pools, self.stopping, control=self._control)
        return start_thread(scheduler.run, "django-jobs-scheduler")

    def start_pruner(self) -> threading.Thread | None:
        """Start the retention thread, unless ``RETENTION`` is None: it deletes the
        runs that finished longer ago, a bounded pass every few minutes."""
        if self.retention is None:
            return None
        pruner = Pruner(self.retention, self.stopping, control=self._control, worker=self.worker_id)
        return start_thread(pruner.run, "django-jobs-retention")

    def request_stop(self) -> None:
        """Stop claiming and drain; asked a second time, give the runs back and stop now."""
        if self.stopping.is_set():
            self.hard_stop.set()
        self.stopping.set()
        self.wake.set()
        with self._slots:
            self._slots.notify_all()

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT call ``request_stop`` (main thread only)."""

        def handle(signum: int, frame: FrameType | None) -> None:
            logger.info("worker=%s got %s", self.worker_id, signal.Signals(signum).name)
            self.request_stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # --- claiming -----------------------------------------------------------------

    def _claim_loop(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            if self.max_runs is not None and self.claimed >= self.max_runs:
                return
            free = self._wait_for_free_slots()
            if not any(free):
                continue
            # Runs finished, and completions written, after this point may have
            # scheduled retries or freed keys this claim missed.
            writes, finished = self._completer.writes, self.finished
            try:
                with self._shared():
                    try:
                        short, complete = self._claim(free)
                    except DatabaseError:
                        discard_broken_connections()
                        raise
                failures = 0
            except DatabaseError as exc:
                failures += 1
                pause = min(0.5 * 2**failures, 10.0)
                logger.warning(
                    "worker=%s claim failed (%s); retrying in %.1fs", self.worker_id, exc, pause
                )
                self.stopping.wait(pause)
                continue
            if short and self._idle_done(writes, finished, complete):
                return

    def _claim(self, free: tuple[int, int]) -> tuple[bool, bool]:
        """Claim for the free threads and async slots, up to ``max_runs``, each batch
        handed to its slots as soon as it is claimed (``Claimer.claim``)."""
        left = math.inf if self.max_runs is None else self.max_runs - self.claimed
        return self._claimer.claim(free, self._dispatch, left)

    def _news(self) -> None:
        """Something may have made runs of either kind due: new runs, woken sleepers."""
        self._claimer.news()
        self.wake.set()
        with self._slots:
            self._slots.notify_all()

    def _wait_for_free_slots(self) -> tuple[int, int]:
        """Block until a thread or an async slot is free and worth claiming for (or the
        worker stops); return how many runs may be claimed for each."""
        with self._slots:
            while not self.stopping.is_set():
                threads, loop = self._free()
                # The threads claim whenever one is free, as their claim reads past
                # nothing (see _claim); the loop when its claim is worth making.
                if threads or (loop and self._claimer.worth_claiming_loop()):
                    break
                # Until a slot frees, news comes, or the loop's poll interval is up.
                poll = self._claimer.next_poll() if loop else self.poll_interval
                self._slots.wait(timeout=max(0.001, poll))
            threads, loop = self._free()
        return (0, 0) if self.stopping.is_set() else (threads, loop)

    def _free(self) -> tuple[int, int]:
        """Free threads and free async slots (under ``_slots``)."""
        running = len(self._in_flight)
        return (
            max(0, self.concurrency - (running - self._async_running)),
            max(0, self.async_concurrency - self._async_running),
        )

    def _idle_done(self, writes: int, finished: int, complete: bool) -> bool:
        """After a short claim: decide whether to stop (burst, max runs) or wait a poll interval.

        ``writes`` is the completer's count of writes before the claim began,
        ``finished`` the count of runs this worker had finished; ``complete``
        whether both kinds of slot were claimed for.
        """
        if self.max_runs is not None and self.claimed >= self.max_runs:
            return True
        if self.burst and not complete:
            self._news()  # claim for both before deciding
            return False
        if self.burst:
            with self._slots:
                if self._in_flight or self._completer.busy():
                    # Something is still running or being recorded, and may
                    # schedule more or free a concurrency key: wait for it.
                    self._slots.wait(timeout=self.poll_interval)
                    return False
                # Done, unless a run finished (a retry, a wake-up) or a completion
                # landed since the claim began.
                done = self._completer.writes == writes and self.finished == finished
            if (
                done
                and self.limits
                and self._quietly(limited_runs.any_due, self.limits, self.pools) is not False
            ):
                # Due runs wait for a rate limit's window (or it could not be
                # told): they are work to do, once it opens.
                self.stopping.wait(self._idle_wait())
                self._claimer.news()
                return False
            return done
        wait = self._idle_wait()
        self.wake.wait(wait)
        self.wake.clear()
        if wait < self.poll_interval:
            # Woken for a rate limit's window: claim for both kinds.
            self._claimer.news()
        return False

    def _idle_wait(self) -> float:
        """Seconds to wait idle: a poll interval, or less when a rate limit's window
        that a claim found full opens sooner."""
        opens = limited_runs.next_open() if self.limits else None
        if opens is None:
            return self.poll_interval
        return min(self.poll_interval, max(0.001, opens - time.monotonic()))

    def _dispatch(self, batch: list[Claim]) -> None:
        logger.debug("worker=%s claimed=%d", self.worker_id, len(batch))
        attempts = [Attempt.of(claim) for claim in batch]
        on_loop = [a for a in attempts if self.async_concurrency and a.is_async]
        with self._slots:
            for attempt in attempts:
                self._in_flight.add(attempt)
            self._async_running += len(on_loop)
        self.claimed += len(batch)
        if on_loop:
            if self._event_loop is None:
                self._event_loop = EventLoop(
                    self._completer, self.hard_stop, self._async_done, self.database_threads
                )
            self._event_loop.submit(on_loop)
        for attempt in attempts:
            if not (self.async_concurrency and attempt.is_async):
                self._queue.put(attempt)

    def _async_done(self, ended: list[tuple[Attempt, Outcome | None]]) -> None:
        """The event loop's report that async runs' tasks are over."""
        self._claimer.loop_news()  # a retry, a freed key: more may be due
        with self._slots:
            for attempt, _ in ended:
                self._in_flight.discard(attempt)
            self._async_running -= len(ended)
            self.finished += len(ended)
            self._slots.notify_all()
        if any(outcome is not Outcome.HANDED_OFF for _, outcome in ended):
            self.wake.set()

    def _written(self) -> None:
        """After the completer's every write: the runs' concurrency keys are free now."""
        self.wake.set()
        with self._slots:
            self._slots.notify_all()

    # --- running ------------------------------------------------------------------

    def _run_slot(self) -> None:
        """One thread of the pool: run claims one after another on one kept connection."""
        completer = self._completer
        while (attempt := self._queue.get()) is not None:
            outcome = None
            try:
                outcome = execute(
                    attempt.claim, attempt=attempt, stop=self.hard_stop, completer=completer
                )
            except Exception:
                logger.exception("run=%s crashed the executor", attempt.run_id)
            finally:
                if outcome is not Outcome.HANDED_OFF and outcome is not Outcome.COMPLETED:
                    # No block is open between two runs: one still open was left
                    # by a failure half-way, and would fail every later query here.
                    end_leaked_transactions()
                # A handed-off completion frees the slot now: the completer writes
                # it (and wakes the claim loop) while this thread runs the next.
                with self._slots:
                    self._in_flight.discard(attempt)
                    self.finished += 1
                    self._slots.notify_all()
                if outcome is not Outcome.HANDED_OFF:
                    # A finished run may have freed a concurrency key or woken a
                    # parent: look for due runs now rather than after a poll interval.
                    self.wake.set()
        connections.close_all()

    # --- shutdown -----------------------------------------------------------------

    def _drain(self) -> int:
        """Wait for in-flight runs up to the shutdown timeout, then release the rest."""
        deadline = time.monotonic() + self.shutdown_timeout
        with self._slots:
            while self._in_flight and not self.hard_stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._slots.wait(timeout=min(left, 0.5))
            leftover = [attempt.claim for attempt in self._in_flight]
        if not leftover:
            return EXIT_OK
        self.hard_stop.set()
        released = self._quietly(transitions.release, self.worker_id, leftover)
        if self._event_loop is not None:
            self._event_loop.stop_all()  # given back: their late writes would be fenced anyway
        self._quietly(notify_pools, self.pools)
        logger.warning(
            "worker=%s released %s unfinished runs back to pending: %s",
            self.worker_id,
            released,
            ",".join(str(c.run_id) for c in leftover),
        )
        return EXIT_RELEASED


def start_thread(target: Callable[[], object], name: str) -> threading.Thread:
    """Start one of a worker's daemon threads."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
