"""The worker's passes over runs held out of the claim's way, and runs waiting for a
turn: each tick and each sweep (every heartbeat interval), in one place."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..ratelimits import Limits
from . import holds, rateholds, turns


def every_tick(pools: Sequence[str] | None, limits: Limits, tick: float) -> bool:
    """Hold the ready runs of full groups, give due runs a turn, release the runs of
    windows that opened; whether runs became ready."""
    holds.hold_taken()
    ready = bool(turns.give_turns(pools))
    if limits:
        ready = bool(rateholds.release_open(limits, tick)) or ready
    return ready


def every_sweep(
    pools: Sequence[str] | None, limits: Limits, job_types: Iterable[str], tick: float
) -> bool:
    """Release what a crash, or a cap or limit changed, left held; hold the ready runs
    of full windows (most are held at start or by the claim that refused them: this
    reads the pool's ready runs, so not every tick); whether runs became ready."""
    ready = bool(holds.release_stranded())
    ready = bool(rateholds.release_stranded(limits, job_types, tick)) or ready
    if limits:
        rateholds.hold_full(limits, pools)
    return ready
