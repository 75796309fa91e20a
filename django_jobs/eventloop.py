"""A worker's event loop: its ``async def`` runs, many at once on one thread.

Each async run is a task on one asyncio loop, on a thread of its own. What the
runs do with the database (steps, children, waits, outcomes) is sync code: it
goes to a few ``DatabaseThreads``, each with its own connection, so a worker
running hundreds of async runs holds a handful of connections, not one per run.
Successful outcomes go to the worker's completer as the threads' do.

The loop and its threads start with the first async run a worker claims; a
worker that never meets one starts neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from .attempt import Attempt
from .completer import Completer
from .execution import Outcome, execute_async
from .storage.connections import discard_broken_connections, end_leaked_transactions

logger = logging.getLogger(__name__)

# How many threads (and connections) do the database work of a worker's async runs
# (fewer where Django's connection pool cannot lend that many).
DATABASE_THREADS = 4

# Told when async runs' tasks are over: [(attempt, its outcome or None when the task
# was stopped)], those that ended in one turn of the loop together, on its thread.
Done = Callable[[list[tuple[Attempt, "Outcome | None"]]], None]

_Call = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class DatabaseThreads:
    """Threads with a connection each, running the sync work of async code in turn."""

    def __init__(self, count: int) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"django-jobs-db-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on one of the threads; its result or its exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        self._calls.put((fn, args, loop, future))
        return await future

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads once the calls given before are done; their connections close."""
        for _ in self._threads:
            self._calls.put(None)
        for thread in self._threads:
            thread.join(timeout=timeout)

    def _serve(self) -> None:
        try:
            while (call := self._calls.get()) is not None:
                fn, args, loop, future = call
                if future.cancelled():  # its task was stopped while the call waited
                    continue
                try:
                    result = fn(*args)
                except BaseException as exc:  # Suspended and LeaseLost too: the caller's
                    # Settled first: a caller that never hears back holds its run for good.
                    _settle(loop, future, exc, error=True)
                    if isinstance(exc, DatabaseError):
                        discard_broken_connections()
                    end_leaked_transactions()
                else:
                    _settle(loop, future, result)
        finally:
            connections.close_all()


def _settle(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any, *, error: bool = False
) -> None:
    def settle() -> None:
        if future.cancelled():
            return
        if error:
            exc = value
            if isinstance(exc, StopIteration):  # a future cannot hold one (PEP 479)
                exc = RuntimeError(f"{type(exc).__name__} raised in a step's function")
            future.set_exception(exc)
        else:
            future.set_result(value)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
        loop.call_soon_threadsafe(settle)


class EventLoop:
    """The loop thread of a worker's async runs, and their database threads."""

    def __init__(
        self,
        completer: Completer,
        stop: threading.Event,
        done: Done,
        database_threads: int = DATABASE_THREADS,
    ) -> None:
        self._completer = completer
        self._stop = stop  # the worker's hard stop
        self._done = done
        self._ended: list[tuple[Attempt, Outcome | None]] = []  # not yet reported
        self._tasks: set[asyncio.Task[None]] = set()
        self.database = DatabaseThreads(database_threads)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name="django-jobs-event-loop", daemon=True
        )
        self._thread.start()

    def submit(self, attempts: list[Attempt]) -> None:
        """Start running ``attempts`` (any thread)."""
        for attempt in attempts:
            attempt.run_sync = self.database.run
        self._loop.call_soon_threadsafe(self._start, attempts)

    def stop_all(self) -> None:
        """Cancel every async run still going (their runs were given back)."""

        def cancel() -> None:
            for task in self._tasks:
                task.cancel()

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(cancel)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs, stop the loop and its threads."""
        self.stop_all()
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout)
        self.database.close(timeout=timeout)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            # Let the canceled tasks unwind (their finally blocks, the slots' release).
            if self._tasks:
                self._loop.run_until_complete(asyncio.wait(list(self._tasks), timeout=2.0))
        finally:
            self._loop.close()

    def _start(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            self._start_one(attempt)

    def _start_one(self, attempt: Attempt) -> None:
        task = self._loop.create_task(
            self._execute(attempt), name=f"django-jobs-run-{attempt.run_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, attempt: Attempt) -> None:
        outcome: Outcome | None = None
        try:
            outcome = await execute_async(attempt, stop=self._stop, completer=self._completer)
        except asyncio.CancelledError:
            logger.debug("run=%s task stopped by the worker", attempt.run_id)
        except Exception:
            logger.exception("run=%s crashed the executor", attempt.run_id)
        finally:
            # Reported together at the end of this turn of the loop: runs that end
            # at once free their slots at once, for one claim rather than one each.
            if not self._ended:
                self._loop.call_soon(self._report)
            self._ended.append((attempt, outcome))

    def _report(self) -> None:
        ended, self._ended = self._ended, []
        self._done(ended)
