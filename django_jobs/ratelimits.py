"""Rate limits: ``Rate`` ("100/m"), the limits a worker enforces, and the window maths. No SQL.

A limit bounds how many runs *start* in any window of its period: at most
``count`` starts in every span of ``seconds``, a sliding window, not a fixed one
that would let ``2 * count`` through around a boundary. A job declares one
(``@job(rate_limit="100/m")``), shared by all its runs or, with
``rate_limit_key``, one per key; a pool gets one from
``DJANGO_JOBS["RATE_LIMITS"]``. The claim enforces them for every worker together
(``storage.ratelimits``): a run whose limit is spent is not claimed until its
window allows another start.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import conf
from .names import pool_problem

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
# At most this many starts per window: the starts of a window are kept, grouped
# by the claim that made them, in the limit's row.
MAX_COUNT = 100_000
MAX_PERIOD = 7 * 86_400.0
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any ``seconds``."""

    count: int
    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise TypeError(f"a rate's count must be an int, got {self.count!r}")
        if not 1 <= self.count <= MAX_COUNT:
            raise ValueError(f"a rate's count must be 1-{MAX_COUNT}, got {self.count}")
        if not 0 < self.seconds <= MAX_PERIOD:  # NaN fails too
            raise ValueError(
                f"a rate's period must be positive and at most a week, got {self.seconds!r}s"
            )

    def __str__(self) -> str:
        for unit, size in sorted(UNITS.items(), key=lambda item: -item[1]):
            if self.seconds == size:
                return f"{self.count}/{unit}"
        for unit, size in sorted(UNITS.items(), key=lambda item: -item[1]):
            if (self.seconds / size).is_integer():
                return f"{self.count}/{int(self.seconds / size)}{unit}"
        return f"{self.count}/{self.seconds:g}s"


def parse_rate(value: object) -> Rate:
    """A ``Rate`` from ``"count/unit"`` ("100/m", "5/s", "1000/h", "50/d"), with an
    optional number of units ("10/30s", "1/5m"), or a ``Rate`` as it is.

    Raises ``TypeError`` or ``ValueError`` saying what is wrong.
    """
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise TypeError(f"a rate limit must be a string such as '100/m', got {value!r}")
    match = _RATE.fullmatch(value)
    if match is None:
        raise ValueError(
            f"a rate limit is 'count/unit' with a unit of s, m, h or d "
            f"(such as '100/m' or '10/30s'), got {value!r}"
        )
    count, units, unit = match.groups()
    return Rate(int(count), float(units or 1) * UNITS[unit])


# --- the limits in force ---------------------------------------------------------


class Job(Protocol):
    """What a limit needs of a registered job (``registry.JobHandler``)."""

    @property
    def job_type(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def rate_limit(self) -> Rate | None: ...
    @property
    def keyed_rate(self) -> bool: ...


@dataclass(frozen=True)
class Limits:
    """The rate limits a claim enforces: by job type (shared by its runs, or one per
    run's ``rate_key`` for the types in ``keyed``) and by pool."""

    jobs: Mapping[str, Rate] = field(default_factory=dict)
    keyed: frozenset[str] = frozenset()
    pools: Mapping[str, Rate] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.pools)

    def signature(self) -> tuple[Any, ...]:
        """What a claim's statement depends on: every limit and its rate (hashable)."""
        return (
            tuple(sorted((name, rate.count, rate.seconds) for name, rate in self.jobs.items())),
            tuple(sorted(self.keyed)),
            tuple(sorted((name, rate.count, rate.seconds) for name, rate in self.pools.items())),
        )


def in_force(handlers: Mapping[str, Job], pools: Iterable[str] | None = None) -> Limits:
    """The limits of the jobs registered in ``handlers`` (every one: a run may be
    started in another pool than its job's) and of the pools (of ``pools``, or
    all) that ``DJANGO_JOBS["RATE_LIMITS"]`` names; invalid entries are left out,
    the system checks report them."""
    wanted = None if pools is None else set(pools)
    jobs = {job.job_type: job.rate_limit for job in handlers.values() if job.rate_limit is not None}
    keyed = frozenset(job.job_type for job in handlers.values() if job.keyed_rate)
    by_pool = {}
    for name, value in settings_limits().items():
        if wanted is not None and name not in wanted:
            continue
        try:
            by_pool[name] = parse_rate(value)
        except (TypeError, ValueError):
            continue
    return Limits(jobs, keyed & set(jobs), by_pool)


def settings_limits() -> dict[Any, Any]:
    limits = conf.merged()["RATE_LIMITS"]
    return limits if isinstance(limits, dict) else {}


def settings_problems() -> list[str]:
    """Every problem of ``DJANGO_JOBS["RATE_LIMITS"]`` (check E014)."""
    limits = conf.merged()["RATE_LIMITS"]
    if not isinstance(limits, dict):
        return [f"DJANGO_JOBS['RATE_LIMITS'] must be a dict of rates by pool, got {limits!r}"]
    found = []
    for name, value in limits.items():
        if not isinstance(name, str) or pool_problem(name) is not None:
            found.append(f"DJANGO_JOBS['RATE_LIMITS']: {name!r} is not a pool name")
            continue
        try:
            parse_rate(value)
        except (TypeError, ValueError) as exc:
            found.append(f"DJANGO_JOBS['RATE_LIMITS'][{name!r}]: {exc}")
    return found


# --- the window --------------------------------------------------------------------

# The starts of a limit's window: [instant, count] pairs, oldest first, instants
# in seconds since the epoch on the database's clock.
Starts = list[list[float]]


@dataclass
class Window:
    """One limit's starts within its window, as read under the limit's row lock.

    ``admit`` takes starts one at a time; ``opens_at`` says when a full window
    next lets one through. Stored entries from a clock that went back, or
    malformed ones (the row is writable by anyone with database access), are
    dropped rather than trusted.
    """

    rate: Rate
    now: float
    starts: Starts = field(default_factory=list)
    taken: int = 0  # starts admitted at ``now`` by this claim

    @classmethod
    def read(cls, stored: Any, rate: Rate, now: float) -> Window:
        starts: Starts = []
        if isinstance(stored, list):
            for entry in stored[-MAX_COUNT:]:
                if (
                    isinstance(entry, list)
                    and len(entry) == 2
                    and all(isinstance(v, int | float) and not isinstance(v, bool) for v in entry)
                    and math.isfinite(entry[0])
                    # Still in the window (the same sum as opens_at's, so that a
                    # window opens exactly then), and not from the future.
                    and now < entry[0] + rate.seconds
                    and entry[0] <= now + rate.seconds
                    and 0 < entry[1] <= MAX_COUNT
                ):
                    starts.append([float(entry[0]), int(entry[1])])
        starts.sort()
        return cls(rate, now, starts)

    def count(self) -> int:
        return sum(int(n) for _, n in self.starts) + self.taken

    def has_room(self) -> bool:
        return self.count() < self.rate.count

    def admit(self) -> None:
        self.taken += 1

    def stored(self) -> Starts:
        """The starts to keep: the window's, with this claim's last."""
        if not self.taken:
            return self.starts
        return [*self.starts, [self.now, self.taken]]

    def opens_at(self) -> float | None:
        """When the window next has room (epoch seconds), or None when it has room now."""
        over = self.count() - self.rate.count
        if over < 0:
            return None
        for instant, n in self.stored():
            over -= int(n)
            if over < 0:
                return instant + self.rate.seconds
        return self.now + self.rate.seconds  # not reached: the window has over + 1 starts
