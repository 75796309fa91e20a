"""Helpers for users' own tests."""

from __future__ import annotations

from .inline import drain_due


def drain(pool: str | None = None, *, batch_size: int = 100) -> int:
    """Run due runs in this process, one after another, until none is due; return how many ran.

    ``pool=None`` drains every pool. Runs that retry with a backoff, and durable
    sleeps, become due later and are not waited for (a sleep that is over is
    woken and run). Runs are claimed and recorded exactly as a worker would
    (attempts, leases, fenced outcomes), under a short-lived Worker row named
    after this process.
    """
    return drain_due(None if pool is None else [pool], batch_size=batch_size)
