"""``Attempt``: the engine's side of one attempt of a claimed run.

The worker and ``execution`` keep here what the handler must not touch: the
claim and its handler, the attempt's clock and deadline, whether a cancel was
noticed, and who records the outcome. The handler sees a ``JobContext``, a
façade over its attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async

from .exceptions import UnknownJobType
from .registry import JobHandler, get_handler
from .storage.claiming import Claim

# Runs a sync function with a database connection, for an async handler's
# context: ``await run_sync(fn, *args, **kwargs)``.
SyncRunner = Callable[..., Awaitable[Any]]


def thread_sensitive(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
    """``fn(*args)`` where Django runs sync code for async code: the thread of an
    enclosing ``async_to_sync`` (a worker's slot, ``drain()``), else its one sync thread."""
    return sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


class Attempt:
    """One attempt of one claimed run, as the engine tracks it."""

    def __init__(self, claim: Claim, handler: JobHandler | None) -> None:
        self.claim = claim
        self.handler = handler  # None: no handler is registered for the job type
        self.started = time.monotonic()
        timeout = None if handler is None else handler.timeout
        self.deadline = None if timeout is None else self.started + timeout
        # Set once the worker noticed a cancel request (or took the run away).
        self.cancel_noticed_at: float | None = None
        # Transactions already open when the handler was called (a test's, or
        # drain() inside one); deeper ones are the handler's.
        self.atomic_depth = 0
        # Who writes this attempt's outcome: the handler's thread once the
        # handler has returned (or suspends), or the worker when it finishes the
        # run over the handler's head (timeout, ignored cancel). First come owns it.
        self._outcome_lock = threading.Lock()
        self._outcome_owner: str | None = None
        # An async handler's: where its context's database work runs (the
        # worker's database threads on its event loop), and its task once started.
        self.run_sync: SyncRunner = thread_sensitive
        self._task: asyncio.Task[Any] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        self.task_stopped = False  # the worker canceled the handler's task

    @classmethod
    def of(cls, claim: Claim) -> Attempt:
        """The attempt of ``claim``, with its handler looked up (None when unknown)."""
        try:
            handler = get_handler(claim.job_type, resolve=True)
        except UnknownJobType:
            handler = None
        return cls(claim, handler)

    @property
    def run_id(self) -> int:
        return self.claim.run_id

    @property
    def is_async(self) -> bool:
        """Whether the handler is an ``async def`` function."""
        return self.handler is not None and self.handler.is_async

    def __repr__(self) -> str:
        return f"<Attempt run={self.claim.run_id} attempt={self.claim.attempt}>"

    # --- cancellation -------------------------------------------------------------

    @property
    def cancel_noticed(self) -> bool:
        return self.cancel_noticed_at is not None

    def notice_cancel(self) -> None:
        """The worker saw a cancel request for this run (or the run was taken away)."""
        if self.cancel_noticed_at is None:
            self.cancel_noticed_at = time.monotonic()

    # --- who records the outcome ---------------------------------------------------

    @property
    def fenced_off(self) -> bool:
        """True once the worker finished the run over the handler's head."""
        return self._outcome_owner == "worker"

    def fence_off(self) -> bool:
        """Worker: take the outcome over. True once; False if the handler's thread
        has it, or the worker took it already (it finishes the run once)."""
        with self._outcome_lock:
            if self._outcome_owner is not None:
                return False
            self._outcome_owner = "worker"
            return True

    def own_outcome(self) -> bool:
        """Handler's thread: take the outcome (again); False if the worker fenced the run off."""
        with self._outcome_lock:
            if self._outcome_owner is None:
                self._outcome_owner = "handler"
            return self._outcome_owner == "handler"

    def yield_outcome(self) -> None:
        """Handler's thread: give the outcome back after a wait that did not suspend
        (an event was there, or its deadline had passed): the worker may end the
        run over the handler's head again (a timeout, an ignored cancel)."""
        with self._outcome_lock:
            if self._outcome_owner == "handler":
                self._outcome_owner = None

    # --- an async handler's task -------------------------------------------------

    def bind_task(self) -> None:
        """Async handler: remember the task running it, so that the worker can stop it."""
        self._task = asyncio.current_task()
        self._task_loop = asyncio.get_running_loop()

    def stop_task(self) -> None:
        """Worker, any thread: cancel the async handler's task (a timeout, an ignored
        cancel, a release at shutdown), so that it stops at its next ``await``."""
        task, loop = self._task, self._task_loop
        if task is None or loop is None or task.done():
            return
        self.task_stopped = True
        with contextlib.suppress(RuntimeError):  # a closed loop: the task went with it
            loop.call_soon_threadsafe(task.cancel)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline
