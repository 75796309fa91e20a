"""This thread's connection to the jobs database, and closing connections that broke."""

from __future__ import annotations

import logging
import threading

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import conf

logger = logging.getLogger(__name__)
_thread = threading.local()


def jobs_connection() -> BaseDatabaseWrapper:
    """This thread's connection to the jobs database.

    Looked up once per thread: Django keeps one connection object per thread
    and alias, and ``connections[alias]`` is a lookup each run would pay for.
    """
    alias = conf.get().DATABASE
    if getattr(_thread, "alias", None) != alias:
        _thread.connection, _thread.alias = connections[alias], alias
    connection: BaseDatabaseWrapper = _thread.connection
    return connection


def discard_broken_connections() -> None:
    """Close this thread's connections that errored and no longer answer.

    Connections are otherwise kept open across runs: reconnecting per run costs
    more than the run itself for short jobs. Never raises: a connection whose
    (re)connection broke half-way cannot even be asked (MySQL's ``ping`` on no
    connection), and is closed as broken.
    """
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred:
            try:
                broken = connection.in_atomic_block or not connection.is_usable()
            except Exception:
                broken = True
            if broken:
                try:
                    connection.close()
                except Exception:
                    logger.debug("closing a broken connection failed", exc_info=True)
                    connection.connection = None  # opened afresh at the next query
            connection.errors_occurred = False
