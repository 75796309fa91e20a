"""Pause and resume pools: the writers the admin and ``manage.py jobpool`` call.

A paused pool keeps its runs: new runs are still accepted and running ones
finish, but no worker claims a pending run of it until it is resumed. The claim
statement reads the paused pools itself (``claims._candidates``), so a pause
takes effect at the next claim of every worker, without a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db.models.functions import Now

from . import conf
from .models import JobPool
from .notify import notify_pools

logger = logging.getLogger(__name__)

MAX_POOL_NAME = 100
MAX_PAUSE_REASON = 1000


def pool_problem(name: object) -> str | None:
    """Why ``name`` cannot be a pool name, or None."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if len(name) > MAX_POOL_NAME:
        return f"is longer than {MAX_POOL_NAME} characters"
    if "\x00" in name:
        return "contains a NUL character"
    return None


def reason_problem(reason: object) -> str | None:
    """Why ``reason`` cannot be a pause reason, or None."""
    if not isinstance(reason, str):
        return "is not a string"
    if len(reason) > MAX_PAUSE_REASON:
        return f"is longer than {MAX_PAUSE_REASON} characters"
    if "\x00" in reason:
        return "contains a NUL character"
    return None


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
    return bool(changed)


def paused_pools() -> dict[str, JobPool]:
    """The paused pools by name."""
    pools = _pools().filter(paused_at__isnull=False)
    return {pool.name: pool for pool in pools}


def record_pools(names: Iterable[str]) -> None:
    """Make a row for each pool a worker serves, so the admin lists it (idempotent)."""
    _pools().bulk_create([JobPool(name=name) for name in names], ignore_conflicts=True)
