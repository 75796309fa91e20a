"""Helpers for users' own tests."""

from __future__ import annotations

import os
import socket

from . import transitions
from .execution import execute
from .storage import holds, rateholds, turns, workers
from .storage.claiming import claim_batch


def drain(pool: str | None = None, *, batch_size: int = 100) -> int:
    """Run due runs in this process, one after another, until none is due; return how many ran.

    ``pool=None`` drains every pool. Runs that retry with a backoff, and durable
    sleeps, become due later and are not waited for (a sleep that is over is
    woken and run). Runs are claimed and recorded exactly as a worker would
    (attempts, leases, fenced outcomes), under a short-lived Worker row named
    after this process.
    """
    pools = None if pool is None else [pool]
    worker = workers.register_worker(f"{socket.gethostname()} (drain)", os.getpid(), pools, 1)
    ran = 0
    try:
        while True:
            # Sleeps that are over are woken first, as a worker's watchdog would.
            transitions.wake_sleepers()
            turns.give_turns(pools)
            # No rate limit is enforced here: runs held for a window are ready.
            rateholds.release_all(pools)
            batch = claim_batch(worker.pk, pools, batch_size)
            # Runs held for a concurrency key are released after the commit that
            # freed it, which a test's transaction may never reach: here, at once.
            if not batch and not holds.release_stranded():
                break
            for claim in batch:
                execute(claim)
                ran += 1
    finally:
        workers.stop_worker(worker.pk)
    return ran
