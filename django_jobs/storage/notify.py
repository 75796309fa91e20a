"""Wake-ups over PostgreSQL LISTEN/NOTIFY, with polling as the fallback.

A trigger (migration 0001) sends ``NOTIFY django_jobs, '<pool>'`` once per
INSERT statement that adds pending runs, so ``start()`` and ``start_many()``
cost no extra round trip; the notification is delivered at commit, and never
for a transaction that rolls back. The rarer paths that make runs pending
again (wake-ups, rescue, release, retry, run now) call ``notify_pools``.
Each worker keeps one extra connection that LISTENs and sets its wake event.

Behind a connection pooler in transaction mode (PgBouncer's usual mode), a
LISTEN succeeds and then hears nothing: the pooler hands its server session to
other clients. So each new listening connection first sends itself a probe
over the worker's other connection; a listener that does not hear it within
``PROBE_WAIT`` says so once and stops, and the worker polls every
``POLL_INTERVAL``. ``LISTEN_NOTIFY = False`` skips the probe and the warning.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from .. import conf
from . import vendors
from .control import ControlConnection

logger = logging.getLogger(__name__)

CHANNEL = "django_jobs"
PROBE_WAIT = 5.0  # seconds a new listener waits for its probe


def notify_pools(pools: Iterable[str]) -> None:
    """Tell listening workers that runs of ``pools`` are due (at the caller's commit)."""
    connection = connections[conf.get().DATABASE]
    names = sorted(set(pools))
    if names:
        vendors.of(connection).notify(connection, CHANNEL, names)


def raw_connection_params() -> dict[str, Any]:
    """Django's connection settings for the jobs database, for a plain psycopg connection."""
    params = connections[conf.get().DATABASE].get_connection_params()
    # Django's own cursor class and type adapters belong to its connections.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


class Unheard(Exception):
    """A listener's probe did not come back: notifications do not reach it."""


class Listener:
    """A thread that LISTENs for due runs of some pools and calls ``wake`` for them."""

    def __init__(
        self,
        pools: Iterable[str],
        wake: Callable[[], None],
        stop: threading.Event,
        control: ControlConnection,
    ) -> None:
        self.pools = set(pools)
        self.wake = wake
        self.stop = stop
        self.control = control  # the worker's other connection, which sends the probe
        self.connected = threading.Event()
        self.deaf = False  # set when the probe went unheard: the worker polls
        self._pause = 0.5
        self._thread = threading.Thread(target=self._loop, name="django-jobs-listener", daemon=True)

    @staticmethod
    def enabled() -> bool:
        """LISTEN needs the setting, PostgreSQL, and Django's psycopg 3 driver (not psycopg2)."""
        settings = conf.get()
        if not settings.LISTEN_NOTIFY or not vendors.of_alias(settings.DATABASE).listens:
            return False
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        return is_psycopg3

    def _hear_probe(self, connection: Any) -> None:
        """Send a probe over the control connection and wait for it here; raise
        ``Unheard`` when it does not come. Wake-ups heard meanwhile are served."""
        token = f"probe:{uuid.uuid4().hex}"
        with self.control, connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, token])
        deadline = time.monotonic() + PROBE_WAIT
        while (left := deadline - time.monotonic()) > 0 and not self.stop.is_set():
            for note in connection.notifies(timeout=min(left, 1.0)):
                if note.payload == token:
                    return
                if note.payload in self.pools:
                    self.wake()
        if not self.stop.is_set():
            raise Unheard(token)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _loop(self) -> None:
        self.control.adopt()
        try:
            self._keep_listening()
        finally:
            self.control.leave()

    def _keep_listening(self) -> None:
        while not self.stop.is_set():
            try:
                self._listen()
            except Unheard:
                self.deaf = True
                logger.warning(
                    "LISTEN/NOTIFY does not reach this worker (a connection pooler in "
                    "transaction mode?): it polls every %gs instead. Set "
                    "DJANGO_JOBS['LISTEN_NOTIFY'] = False to say so.",
                    conf.get().POLL_INTERVAL,
                )
                return
            except Exception as exc:  # any failure: the poll covers, then reconnect
                self.connected.clear()
                logger.warning("listener lost its connection (%s); polling meanwhile", exc)
                self.stop.wait(self._pause)
                self._pause = min(self._pause * 2, 10.0)

    def _listen(self) -> None:
        import psycopg

        with psycopg.connect(**raw_connection_params(), autocommit=True) as connection:
            connection.execute(f"LISTEN {CHANNEL}")
            self._hear_probe(connection)
            self.connected.set()
            self._pause = 0.5  # the backoff starts over after each good connection
            # A wake-up after (re)connecting: a notification may have been
            # missed while no connection listened.
            self.wake()
            while not self.stop.is_set():
                for note in connection.notifies(timeout=1.0):
                    if note.payload in self.pools:
                        self.wake()
