"""RetryPolicy and the pure backoff maths. Nothing here touches the database."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from .conf import to_seconds

Backoff = Literal["exponential", "fixed"]


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing run is tried, and how long to wait between attempts.

    ``attempts`` counts every attempt, the first included: ``attempts=1`` never retries.
    ``non_retryable`` holds exception classes (subclasses match) or names: a class
    name, a dotted path, or the value of the exception's ``code`` attribute.
    """

    attempts: int = 3
    backoff: Backoff = "exponential"
    base_delay: float | timedelta = 1.0
    max_delay: float | timedelta | None = None
    jitter: bool = True
    non_retryable: Iterable[type[BaseException] | str] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"RetryPolicy.attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.backoff not in ("exponential", "fixed"):
            raise ValueError(
                f"RetryPolicy.backoff must be 'exponential' or 'fixed', got {self.backoff!r}"
            )
        object.__setattr__(self, "base_delay", _non_negative("base_delay", self.base_delay))
        if self.max_delay is not None:
            object.__setattr__(self, "max_delay", _non_negative("max_delay", self.max_delay))
        entries = tuple(self.non_retryable)
        for entry in entries:
            if not (isinstance(entry, str) or _is_exception_class(entry)):
                raise TypeError(
                    f"RetryPolicy.non_retryable takes exception classes or names, got {entry!r}"
                )
        object.__setattr__(self, "non_retryable", entries)

    def delay(self, attempt: int, rand: random.Random | None = None) -> float:
        """Return the seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return backoff_delay(
            attempt,
            backoff=self.backoff,
            base=float(self.base_delay),  # type: ignore[arg-type]
            cap=None if self.max_delay is None else float(self.max_delay),  # type: ignore[arg-type]
            jitter=self.jitter,
            rand=rand,
        )

    def is_retryable(self, error: BaseException) -> bool:
        """Tell whether ``error`` may be retried at all under this policy."""
        return not any(_matches(entry, error) for entry in self.non_retryable)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Tell whether a run whose attempt number ``attempt`` raised ``error`` goes again."""
        return attempt < self.attempts and self.is_retryable(error)


def backoff_delay(
    attempt: int,
    *,
    backoff: Backoff,
    base: float,
    cap: float | None,
    jitter: bool,
    rand: random.Random | None = None,
) -> float:
    """Return the delay after attempt ``attempt``: ``base * 2^(attempt-1)`` or ``base``.

    The result is capped by ``cap``; with ``jitter`` it is drawn uniformly from
    ``[0, delay]`` ("full jitter"), which spreads a thundering herd of retries.
    """
    if backoff == "fixed":
        delay = base
    else:
        # Past 2**1000 a float overflows; any cap is long reached by then.
        exponent = min(max(attempt - 1, 0), 1000)
        delay = base * 2.0**exponent
    if cap is not None:
        delay = min(delay, cap)
    if jitter:
        delay = (rand or random).uniform(0.0, delay)
    return delay


def _non_negative(name: str, value: float | timedelta) -> float:
    try:
        seconds = to_seconds(value)
    except TypeError:
        raise TypeError(
            f"RetryPolicy.{name} must be seconds or a timedelta, got {value!r}"
        ) from None
    if seconds < 0:
        raise ValueError(f"RetryPolicy.{name} must not be negative, got {value!r}")
    return seconds


def _is_exception_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def _matches(entry: type[BaseException] | str, error: BaseException) -> bool:
    if isinstance(entry, type):
        return isinstance(error, entry)
    cls = type(error)
    names = {cls.__name__, f"{cls.__module__}.{cls.__qualname__}"}
    try:
        code = getattr(error, "code", None)
        if code is not None:
            names.add(str(code))
    except Exception:  # an exception whose attributes raise still gets classified
        pass
    return entry in names


# The policy of a handler given no ``retry``: one attempt, no retry.
NO_RETRY = RetryPolicy(attempts=1, jitter=False)
