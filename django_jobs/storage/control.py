"""One database connection for a worker's control threads, used in turns.

A worker's slots each hold a connection: a handler's queries and steps run on
it. Everything else a worker does (claiming, heartbeats, the watchdog's
sweeps, batched completions, schedules) is a few short statements now and
then, and shares the connection of the thread that started the worker: the
worker then holds its concurrency plus one, and one more to LISTEN.

The rules that make sharing safe:

* a control thread touches the jobs database only inside ``with control:``,
  which holds the lock for the whole operation, its transaction included, so
  no two threads' statements ever interleave on the connection;
* no operation waits long while holding it, or the heartbeat would wait too:
  a row lock is waited for at most ``lock_wait`` seconds where the database
  bounds it per session (PostgreSQL's ``lock_timeout``; the write fails and is
  retried), and a retry's pause is spent without the lock (``released``).

What a signal receiver does runs under the lock too, so receivers of run
signals should be quick.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any

from django.db import DatabaseError, connections

from . import vendors

_held = threading.local()  # the ControlConnection this thread holds, if any


class ControlConnection:
    """The calling thread's connection to the jobs database, shared with the
    threads that ``adopt`` it and used by one of them at a time."""

    def __init__(self, alias: str, *, lock_wait: float = 1.0) -> None:
        self.alias = alias
        self.lock_wait = lock_wait
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._prepared: Any = None  # the DB-API connection lock_timeout was set on
        self.wrapper = connections[alias]
        self.wrapper.inc_thread_sharing()

    def adopt(self) -> None:
        """Make the calling thread use the shared connection (at the thread's start)."""
        connections[self.alias] = self.wrapper

    def leave(self) -> None:
        """At a control thread's end: forget the shared connection (its owner
        keeps it) and close whatever other connections the thread opened."""
        with suppress(AttributeError):
            del connections[self.alias]
        connections.close_all()

    def release(self) -> None:
        """At the worker's end, on the thread that created it: the connection is
        that thread's alone again (it closes it, or goes on using it)."""
        with self:
            self.wrapper.dec_thread_sharing()

    def __enter__(self) -> ControlConnection:
        self.enter()
        return self

    def enter(self, timeout: float = -1) -> bool:
        """Take the connection, waiting at most ``timeout`` seconds (for ever when
        negative); whether it was taken. ``__exit__`` gives it back."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._lock.acquire(timeout=timeout):
            return False
        self._owner, self._depth = me, 1
        _held.control = self
        self._prepare()
        return True

    @contextmanager
    def aside(self) -> Iterator[None]:
        """A connection of the calling thread's own for the block, closed after it:
        for a heartbeat that must not wait behind an operation holding the shared
        one (a slow signal receiver), at the cost of one more connection meanwhile."""
        own = connections.create_connection(self.alias)
        connections[self.alias] = own
        try:
            yield
        finally:
            own.close()
            connections[self.alias] = self.wrapper

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            _held.control = None
            self._lock.release()

    def _prepare(self) -> None:
        """Bound row-lock waits on this connection, once per database session."""
        wrapper = self.wrapper
        if wrapper.in_atomic_block:
            return
        try:
            wrapper.ensure_connection()
            if wrapper.connection is not self._prepared:
                vendors.of(wrapper).prepare_control(wrapper, self.lock_wait)
                self._prepared = wrapper.connection
        except DatabaseError:
            pass  # the operation meets the same error and is retried


@contextmanager
def released() -> Iterator[None]:
    """Let the other control threads have the connection while this thread waits
    (a retry's pause). Does nothing on other threads, or inside a transaction."""
    control: ControlConnection | None = getattr(_held, "control", None)
    if (
        control is None
        or control._owner != threading.get_ident()
        or control.wrapper.in_atomic_block
    ):
        yield
        return
    depth = control._depth
    control._owner, control._depth = None, 0
    _held.control = None
    control._lock.release()
    try:
        yield
    finally:
        control._lock.acquire()
        control._owner, control._depth = threading.get_ident(), depth
        _held.control = control
