"""What ``runjobworker`` does before its worker starts: wait for the database, check pools."""

from __future__ import annotations

import logging
import time

from django.db import OperationalError, connections

from django_jobs.management.base import database_error, first_line
from django_jobs.models import Worker
from django_jobs.pools import handled_pools

logger = logging.getLogger(__name__)


def wait_for_database(alias: str, timeout: float) -> None:
    """Wait until the jobs database answers, for at most ``timeout`` seconds.

    A database restarting (a deploy, a failover) should not fail a worker that
    its supervisor starts meanwhile. Missing tables are not waited for: the
    error (a ``ProgrammingError``) says to migrate.
    """
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        try:
            Worker.objects.using(alias).exists()  # connects, and finds the tables
            return
        except OperationalError as exc:
            connections[alias].close()
            left = deadline - time.monotonic()
            if left <= 0:
                raise database_error(exc, waited=timeout) from exc
            logger.warning(
                "database=%s unavailable (%s); retrying for %.1fs more",
                alias,
                first_line(exc),
                left,
            )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)


def warn_of_pools_without_handlers(pools: list[str]) -> None:
    """Warn of served pools no handler here enqueues to (a typo, or code deployed elsewhere)."""
    known = handled_pools()
    for pool in pools:
        if pool not in known:
            logger.warning(
                "pool=%s has no registered handler in this process: no @job(pool=%r) "
                "and no tasks queue of that name (a typo? runs enqueued by other code are "
                "still run)",
                pool,
                pool,
            )
