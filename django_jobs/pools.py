"""Pause and resume pools: the writers the admin and ``manage.py jobpool`` call.

A paused pool keeps its runs: new runs are still accepted and running ones
finish, but no worker claims a pending run of it until it is resumed. The claim
statement reads the paused pools itself (``claims._candidates``), so a pause
takes effect at the next claim of every worker, without a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from . import conf
from .models import JobPool, JobRun, Status, Worker, WorkerStatus
from .names import pool_problem as pool_problem  # re-exported for the admin
from .payloads import control_problem
from .registry import all_handlers
from .storage.notify import notify_pools

logger = logging.getLogger(__name__)

MAX_PAUSE_REASON = 1000
TASKS_BACKEND = "django_jobs.tasks_backend.JobsBackend"


def handled_pools() -> set[str]:
    """The pools this process knows runs for: its handlers' (``@job``, and the tasks it
    has met), with their ``JOB_OPTIONS``, and its tasks queues."""
    known = {handler.pool for handler in all_handlers(tasks=True).values()}
    for backend in getattr(settings, "TASKS", {}).values():
        if backend.get("BACKEND") == TASKS_BACKEND:
            # @task functions are found by module path when run, not registered:
            # only the queues the backend names (or Django's default one) are known.
            known.update(backend.get("QUEUES") or ["default"])
    return known


def any_queue() -> bool:
    """Whether a ``JobsBackend`` of ``TASKS`` takes every queue name (``QUEUES = []``),
    so that a task's runs may be in any pool."""
    return any(
        backend.get("BACKEND") == TASKS_BACKEND and backend.get("QUEUES") == []
        for backend in getattr(settings, "TASKS", {}).values()
    )


def run_pools() -> set[str]:
    """The pools runs are sent to by this code base: ``handled_pools()``, and the
    ``pool`` of each ``JOB_OPTIONS`` entry."""
    found: set[object] = set(handled_pools())
    options = conf.merged()["JOB_OPTIONS"]
    if isinstance(options, dict):
        found.update(entry.get("pool") for entry in options.values() if isinstance(entry, dict))
    return _pool_names(found)


def limited_pools() -> dict[str, set[str]]:
    """The pools named by the settings that limit pools, by setting: ``RATE_LIMITS``
    and ``TENANT_CONCURRENCY`` (``"*"`` aside). Settings that are not dicts name none."""
    values = conf.merged()
    return {
        key: _pool_names(name for name in values[key] if name != "*")
        for key in ("RATE_LIMITS", "TENANT_CONCURRENCY")
        if isinstance(values[key], dict)
    }


def declared_pools() -> set[str]:
    """The pools this code base declares: those runs are sent to (``run_pools``),
    and those its settings limit (``limited_pools``)."""
    return run_pools().union(*limited_pools().values())


def _pool_names(names: Iterable[object]) -> set[str]:
    return {name for name in names if isinstance(name, str) and pool_problem(name) is None}


def reason_problem(reason: object) -> str | None:
    """Why ``reason`` cannot be a pause reason, or None."""
    if not isinstance(reason, str):
        return "is not a string"
    if len(reason) > MAX_PAUSE_REASON:
        return f"is longer than {MAX_PAUSE_REASON} characters"
    # Control characters: a terminal would act on them when jobstatus or
    # jobpool list prints the reason.
    return control_problem(reason)


def _checked(name: object) -> str:
    problem = pool_problem(name)
    if problem is not None:
        raise ValueError(f"pool {name!r} {problem}")
    assert isinstance(name, str)
    return name


def _pools() -> Any:
    return JobPool.objects.using(conf.get().DATABASE)


def pause_pool(name: str, *, reason: str = "") -> bool:
    """Stop workers claiming runs of pool ``name``; False when it was paused already."""
    name = _checked(name)
    problem = reason_problem(reason)
    if problem is not None:
        raise ValueError(f"pause reason {problem}")
    pools = _pools()
    pools.bulk_create([JobPool(name=name)], ignore_conflicts=True)
    changed = pools.filter(name=name, paused_at__isnull=True).update(
        paused_at=Now(), pause_reason=reason
    )
    if changed:
        logger.info("pool=%s paused", name)
    return bool(changed)


def resume_pool(name: str) -> bool:
    """Let workers claim runs of pool ``name`` again; False when it was not paused."""
    name = _checked(name)
    changed = (
        _pools().filter(name=name, paused_at__isnull=False).update(paused_at=None, pause_reason="")
    )
    if changed:
        logger.info("pool=%s resumed", name)
        # Idle workers of the pool wake at once instead of at their next poll.
        notify_pools([name])
        # The test mode runs the pool's due runs now.
        from .api import made_due

        made_due()
    return bool(changed)


def paused_pools() -> dict[str, JobPool]:
    """The paused pools by name."""
    pools = _pools().filter(paused_at__isnull=False)
    return {pool.name: pool for pool in pools}


class PoolInUse(ValueError):
    """The pool still has unfinished runs, a live worker, or a pause to keep."""


def forget_pool(name: str) -> bool:
    """Delete the row of an empty pool, so that it leaves ``jobstatus`` and the admin.

    Returns False when there was no row. Raises ``PoolInUse`` while the pool has
    pending, running or waiting runs, while a live worker serves it (it would
    record the pool again), or while it is paused (forgetting would resume it).
    Finished runs stay; they keep their pool name.
    """
    name = _checked(name)
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        row = _pools().select_for_update().filter(name=name).first()
        if row is None:
            return False
        unfinished = JobRun.objects.using(using).filter(
            pool=name, status__in=[Status.PENDING, Status.RUNNING, Status.WAITING]
        )
        if unfinished.exists():
            raise PoolInUse(f"pool {name!r} has unfinished runs: cancel or finish them first")
        if row.paused_at is not None:
            raise PoolInUse(f"pool {name!r} is paused: resume it first")
        stale = timedelta(seconds=conf.get().STALE_THRESHOLD)
        cutoff = ExpressionWrapper(Now() - Value(stale), output_field=DateTimeField())
        serving = Worker.objects.using(using).filter(
            pools__contains=[name],
            status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING],
            heartbeat_at__gte=cutoff,
        )
        if serving.exists():
            raise PoolInUse(f"pool {name!r} is served by a live worker: stop it first")
        row.delete()
    logger.info("pool=%s forgotten", name)
    return True
