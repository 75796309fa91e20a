"""What a worker claims, and when, for its two kinds of slot: its threads and its event loop.

The threads claim the runs of sync handlers whenever one is free: their claim
reads only their own range of the claim's index (``JobRun.is_async``), however
deep the other kind's backlog. The event loop claims async runs up to its free
slots, in a few batch sizes (so a few claim statements, each prepared once);
after a short claim, only when something may have made async runs due (news: a
notification, an async run finished, a sleeper woken) or its poll interval has
passed, since most workers never meet one. Without async slots
(``async_concurrency`` 0) the threads claim both kinds.

Each kind keeps its claim's plan number (``storage.claiming.claim_batch``): a new
one when its runs come after an empty claim, and at least every ``REPLAN``
seconds.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence

from django.db import DatabaseError

from .ratelimits import Limits
from .storage.claiming import Claim, claim_batch
from .storage.connections import discard_broken_connections

logger = logging.getLogger("django_jobs.worker")

REPLAN = 60.0  # seconds a claim's server-side plan is kept at most
# The two kinds of slot a worker claims for: its threads and its event loop.
THREADS, LOOP = "threads", "loop"
# The most runs one claim takes for the event loop.
MAX_LOOP_BATCH = 512


class Claimer:
    """The claims of one worker for its free threads and its free async slots."""

    def __init__(
        self,
        pools: Sequence[str],
        limits: Limits,
        async_concurrency: int,
        poll_interval: float,
    ) -> None:
        self.pools = list(pools)
        self.limits = limits
        self.loop = async_concurrency > 0
        self.poll_interval = poll_interval
        self.worker_id: uuid.UUID | None = None  # set once the worker is registered
        # Per kind: whether its next claim may find runs its last one did not,
        # whether that claim was full or empty, when it was made, and its plan.
        self._recheck = {THREADS: True, LOOP: True}
        self._was_full = {THREADS: False, LOOP: False}
        self._was_empty = {THREADS: True, LOOP: True}
        self._claimed_at = {THREADS: 0.0, LOOP: 0.0}
        self._plan = {THREADS: 0, LOOP: 0}
        self._planned_at = {THREADS: time.monotonic(), LOOP: time.monotonic()}

    def news(self) -> None:
        """Something may have made runs of either kind due: new runs, woken sleepers,
        a rate limit's window opened."""
        self._recheck[THREADS] = self._recheck[LOOP] = True

    def loop_news(self) -> None:
        """Async runs ended: a retry, a freed key, a woken parent may be due."""
        self._recheck[LOOP] = True

    def worth_claiming_loop(self) -> bool:
        """Whether a claim for the event loop may find runs its last one did not."""
        return (
            self._recheck[LOOP]
            or self._was_full[LOOP]
            or time.monotonic() - self._claimed_at[LOOP] >= self.poll_interval
        )

    def next_poll(self) -> float:
        """Seconds until the event loop's poll interval is up (0 when it is)."""
        return max(0.0, self._claimed_at[LOOP] + self.poll_interval - time.monotonic())

    def claim(
        self,
        free: tuple[int, int],
        dispatch: Callable[[list[Claim]], None],
        left: float = math.inf,
    ) -> tuple[bool, bool]:
        """Claim up to ``left`` runs for the ``free`` threads and async slots, each
        batch handed to ``dispatch`` as soon as it is claimed. Returns whether every
        claim came back short (nothing more is due for now), and whether each
        kind with free slots was claimed for.

        The threads claim first, and their runs start before the loop's claim is
        made: a notification wakes both kinds, most runs are the threads', and a
        sync run's wake-up must not wait for the loop's (mostly empty) claim. A
        run the threads claim that turns out to be async (started by a process
        that did not know its handler was) goes to the event loop all the same;
        a run the loop claims that turns out to be sync, to a thread.
        """
        free_threads, free_async = free
        threads: list[Claim] = []
        short = True
        free_threads = int(min(free_threads, left))
        if free_threads > 0:
            threads = self._claim_kind(THREADS, free_threads, False if self.loop else None)
            short = len(threads) < free_threads
            if threads:
                dispatch(threads)
        left -= len(threads)
        if not (self.loop and free_async and left > 0):
            return short, True
        if not self.worth_claiming_loop():
            return short, False
        limit = int(min(batch_size(free_async), left))
        try:
            on_loop = self._claim_kind(LOOP, limit, True)
        except DatabaseError:
            if not threads:
                raise
            # The threads' runs were claimed and started: log this one, go on.
            logger.warning("worker=%s claim failed", self.worker_id, exc_info=True)
            discard_broken_connections()
            return False, False
        if on_loop:
            dispatch(on_loop)
        return short and len(on_loop) < limit, True

    def _claim_kind(self, kind: str, limit: int, is_async: bool | None) -> list[Claim]:
        self._recheck[kind] = False
        claims = claim_batch(
            self.worker_id,  # type: ignore[arg-type]
            self.pools,
            limit,
            plan=self._plan[kind],
            kind=is_async,
            limits=self.limits,
        )
        now = self._claimed_at[kind] = time.monotonic()
        self._was_full[kind] = len(claims) == limit
        if (claims and self._was_empty[kind]) or now - self._planned_at[kind] > REPLAN:
            self._plan[kind], self._planned_at[kind] = self._plan[kind] + 1, now
        self._was_empty[kind] = not claims
        return claims


def batch_size(free: int) -> int:
    """How many runs to claim for ``free`` async slots: a power of two below 64, a
    multiple of 64 above, at most MAX_LOOP_BATCH. A few sizes, so a few claim
    statements, each prepared once; a claim or two fill the slots."""
    free = min(free, MAX_LOOP_BATCH)
    return free - free % 64 if free >= 64 else 1 << (free.bit_length() - 1)
