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


def end_leaked_transactions() -> None:
    """Reset this thread's connections that are still inside an atomic block.

    Called where no block can be open: a worker's slot between two runs, an
    event loop's database thread between two calls. A connection that says
    otherwise was left so by a failure half-way (seen once with connections
    killed under async runs on MariaDB), and every later query on the thread
    would fail with "Cannot open a new connection in an atomic block".
    """
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            end_leaked_transaction(connection)


def end_leaked_transaction(connection: BaseDatabaseWrapper) -> None:
    """Clear the transaction state of ``connection``, left inside an atomic block, and
    close it (the server rolls back what it held); the next query connects afresh."""
    logger.warning(
        "a connection to %r was left inside a transaction; closed (%d blocks open)",
        connection.alias,
        len(connection.atomic_blocks),
    )
    connection.in_atomic_block = False
    connection.savepoint_ids = []
    connection.atomic_blocks = []
    connection.needs_rollback = False
    connection.closed_in_transaction = False
    try:
        connection.close()
    except Exception:
        logger.debug("closing a connection left in a transaction failed", exc_info=True)
        connection.connection = None
    connection.errors_occurred = False
