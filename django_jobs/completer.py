"""The completer: the completions of many runs written in one statement.

A durable commit costs about as much as a short run. So a worker's threads
hand their successful outcomes to one ``Completer``, which writes whatever
has gathered while its previous write was in flight (group commit, no fixed
wait) in one statement (``transitions.complete_many``), fenced per run exactly like
a single write: a row is only changed while it is running under the lease
token given with it. A thread either waits for its own row's result
(``complete``) or hands the completion over and takes its next run
(``hand_off``); the completer then retries it, and reports it to ``report``
(the worker passes ``execution.record_handed_off``, which logs it, or fails
the run if the database refused its row).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from django.db import InterfaceError, OperationalError, connections

from .storage.claiming import Claim
from .storage.connections import discard_broken_connections
from .storage.control import ControlConnection
from .transitions import complete_many

logger = logging.getLogger(__name__)

# Told how a handed-off completion went: (claim, written or the database's
# refusal, the handler's duration, the worker's hard-stop event).
Report = Callable[[Claim, "bool | BaseException", float, threading.Event], None]

# The most outcomes written in one statement.
MAX_BATCH = 500


@dataclass(eq=False)
class _Pending:
    claim: Claim
    output: Any
    # Set once written; None for a handed-off completion, which nobody waits for.
    done: threading.Event | None = field(default_factory=threading.Event)
    duration: float = 0.0  # of the handler, for the log line of a handed-off run
    written: bool = False
    error: BaseException | None = None


class Completer:
    """Gathers completions from worker threads and writes them in batches.

    Two ways in: ``complete`` waits until the row is written (the caller then
    sends ``run_completed``), ``hand_off`` returns at once and leaves the write
    and its retries to the completer, so the worker's thread is free for the
    next run while the batch is written. ``report(claim, written, duration,
    stop)`` is told how each handed-off completion went: True, False (the lease
    was lost) or the database's refusal of that run. ``after_write`` is called
    (on the completer's thread) after every batch, e.g. to wake the claim loop
    for runs whose concurrency key was just freed.
    """

    def __init__(
        self,
        report: Report,
        after_write: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
        control: ControlConnection | None = None,
    ) -> None:
        self._report = report
        self._items: list[_Pending] = []
        self._lock = threading.Condition()
        self._closed = False
        self._after_write = after_write
        # Set when handed-off completions that cannot be written should be given up.
        self._stop = stop or threading.Event()
        # A worker's shared control connection, taken for each batch; without
        # one, the completer's thread has a connection of its own.
        self._control = control
        self._failures = 0  # consecutive batches lost to a broken connection
        self._held: list[_Pending] = []  # handed-off completions to try again
        self._pause = 0.0  # seconds to wait before trying them
        self._writing = 0  # completions taken from the list and not yet written
        self.writes = 0  # batches written so far
        self._thread = threading.Thread(
            target=self._loop, name="django-jobs-completer", daemon=True
        )
        self._thread.start()

    def complete(self, claim: Claim, output: Any) -> bool:
        """Mark the run completed with ``output``; False when the lease was lost.

        Raises the database error of the batch's write, if it failed: the caller
        (``execution.record``) retries on a fresh connection as for one write.
        """
        item = _Pending(claim, output)
        if not self._add(item):
            # A handler that outlived the worker's drain: write it alone.
            return bool(complete_many([(claim, output)]))
        assert item.done is not None
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.written

    def hand_off(self, claim: Claim, output: Any, duration: float) -> bool | None:
        """Have the run marked completed with ``output`` in the next batch, without waiting.

        Returns None once handed off. After ``close`` (a handler that outlived
        the drain) the run is written alone: True, or False when the lease was lost.
        """
        if self._add(_Pending(claim, output, done=None, duration=duration)):
            return None
        return bool(complete_many([(claim, output)]))

    def try_hand_off(self, claim: Claim, output: Any, duration: float) -> bool:
        """``hand_off`` that never writes itself (for the event loop's thread): False
        once the completer is closed, and the caller writes the run as any other."""
        return self._add(_Pending(claim, output, done=None, duration=duration))

    def close(self) -> None:
        """Write what is gathered, then stop (pending callers get their results)."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=30)

    @contextmanager
    def together(self) -> Iterator[None]:
        """The completions this thread adds in the block are written in one batch."""
        with self._lock:  # reentrant: adding takes it again
            yield

    @property
    def waiting(self) -> int:
        """How many completions are gathered and not yet taken for a write."""
        with self._lock:
            return len(self._items)

    def busy(self) -> bool:
        """Whether completions are waiting to be written or being written."""
        with self._lock:
            return bool(self._items or self._writing)

    def _add(self, item: _Pending) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._items.append(item)
            self._lock.notify()
        return True

    def _loop(self) -> None:
        if self._control is not None:
            self._control.adopt()
        try:
            while True:
                with self._lock:
                    while not self._items and not self._closed:
                        self._lock.wait()
                    if not self._items and self._closed:
                        return
                    batch, self._items = self._items[:MAX_BATCH], self._items[MAX_BATCH:]
                    self._writing = len(batch)
                try:
                    with self._control or nullcontext():
                        self._flush(batch)
                except Exception as exc:
                    # A bug of ours: keep writing (a completer that stopped would
                    # leave runs running on a live worker for good).
                    logger.exception("completer failed on a batch of %d", len(batch))
                    self._give_back(batch, exc)
                if self._held:
                    self._wait_to_retry()
                with self._lock:
                    self._writing = 0
                    self.writes += 1
                if self._after_write is not None:
                    self._after_write()
        finally:
            if self._control is not None:
                self._control.leave()
            else:
                connections.close_all()

    def _flush(self, batch: list[_Pending]) -> None:
        try:
            written = complete_many([(item.claim, item.output) for item in batch])
        except (OperationalError, InterfaceError) as exc:
            # The connection broke: every waiting caller retries on its own
            # (settle); handed-off completions are tried again here.
            discard_broken_connections()
            self._give_back(batch, exc)
            return
        except Exception:
            # One row the database refused must not fail its neighbours: write
            # them one by one, so only the bad one gets the error.
            discard_broken_connections()
            for item in batch:
                self._flush_one(item)
            return
        self._failures = 0
        for item in batch:
            item.written = (item.claim.run_id, item.claim.lease_token) in written
            self._finish(item)

    def _give_back(self, batch: list[_Pending], exc: BaseException) -> None:
        """Answer the waiting callers with ``exc``; try the handed-off ones again later."""
        for item in batch:
            if item.done is not None and not item.done.is_set():
                item.error = exc
                item.done.set()
        self._retry_later([item for item in batch if item.done is None], exc)

    def _retry_later(self, items: list[_Pending], exc: BaseException) -> None:
        if not items:
            return
        self._failures += 1
        pause = min(0.2 * 2 ** (self._failures - 1), 5.0)
        logger.warning(
            "%d completions not written, database unavailable (%s); retrying in %.1fs",
            len(items),
            type(exc).__name__,
            pause,
        )
        # Tried again after the pause, which the loop waits out without holding
        # the control connection.
        self._held.extend(items)
        self._pause = pause

    def _wait_to_retry(self) -> None:
        held, self._held = self._held, []
        if self._stop.wait(self._pause):
            # The worker stops hard: these runs stay running under their lease
            # and are rescued (run again) once this worker's heartbeat is stale.
            logger.error(
                "completions of runs %s not written before the worker stopped",
                ",".join(str(item.claim.run_id) for item in held),
            )
            return
        with self._lock:
            self._items[:0] = held

    def _flush_one(self, item: _Pending) -> None:
        try:
            item.written = bool(complete_many([(item.claim, item.output)]))
        except (OperationalError, InterfaceError) as exc:
            discard_broken_connections()
            if item.done is None:
                self._retry_later([item], exc)
                return
            item.error = exc
        except Exception as exc:
            # Anything else, the database's refusal included, is this run's failure.
            if item.done is None:
                # Nobody waits to turn the error into the run's failure: the report does.
                self._report(item.claim, exc, item.duration, self._stop)
                return
            item.error = exc
        self._finish(item)

    def _finish(self, item: _Pending) -> None:
        if item.done is not None:
            item.done.set()
            return
        self._report(item.claim, item.written, item.duration, self._stop)
