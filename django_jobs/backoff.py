"""RetryPolicy and the pure backoff maths. Nothing here touches the database."""

from __future__ import annotations

import logging
import math
import random
import reprlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from .conf import MAX_DURATION, to_seconds

logger = logging.getLogger(__name__)

Backoff = Literal["exponential", "fixed"]
# A backoff of the project's own: the attempt that failed (1-based) -> the delay.
BackoffFunction = Callable[[int], "float | timedelta"]

# The longest wait before a retry, whoever chose it: a handler's RetryAfter (refused
# past it) or a policy (capped at it). As long as the longest duration setting; far
# longer is a mistake, and near 10**14 seconds a date overflows.
MAX_DELAY = MAX_DURATION


def checked_delay(value: object, what: str) -> float:
    """``value``, seconds (a number) or a ``timedelta``, as float seconds from 0 to
    ``MAX_DELAY``; a ``TypeError`` or ``ValueError`` naming ``what`` otherwise."""
    shown = reprlib.repr(value)  # a 10**400 or a long string stays short in the message
    try:
        seconds = to_seconds(value)
    except TypeError:
        raise TypeError(f"{what} must be seconds or a timedelta, got {shown}") from None
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not 0 <= seconds <= MAX_DELAY:  # NaN fails both
        raise ValueError(f"{what} must be from 0 to {MAX_DELAY:g} seconds (a week), got {shown}")
    return seconds


@dataclass(frozen=True, repr=False)
class RetryPolicy:
    """How often a failing run is tried, and how long to wait between attempts.

    ``attempts`` counts every attempt, the first included: ``attempts=1`` never retries.
    ``backoff`` is ``"exponential"``, ``"fixed"``, or a function of the attempt that
    failed (1-based) returning seconds or a ``timedelta``. ``non_retryable`` holds
    exception classes (subclasses match) or names: a class name, a dotted path, or
    the value of the exception's ``code`` attribute.
    """

    attempts: int = 3
    backoff: Backoff | BackoffFunction = "exponential"
    base_delay: float | timedelta = 1.0
    max_delay: float | timedelta | None = None
    jitter: bool = True
    non_retryable: Iterable[type[BaseException] | str] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"RetryPolicy.attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if not (callable(self.backoff) or self.backoff in ("exponential", "fixed")):
            raise ValueError(
                "RetryPolicy.backoff must be 'exponential', 'fixed' or a function of the "
                f"attempt, got {self.backoff!r}"
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
        """Return the seconds to wait after failed attempt number ``attempt`` (1-based).

        What the backoff gives is capped by ``max_delay`` and by ``MAX_DELAY`` (a
        week), then jittered. A backoff function that raises, or returns anything
        but seconds or a ``timedelta`` from 0 to a week, is logged as an error and
        the exponential backoff over ``base_delay`` is used for this retry instead.
        """
        base = float(self.base_delay)  # type: ignore[arg-type]
        cap = None if self.max_delay is None else float(self.max_delay)  # type: ignore[arg-type]
        if callable(self.backoff):
            chosen = self._called(self.backoff, attempt)
            if chosen is not None:
                return shaped(chosen, cap=cap, jitter=self.jitter, rand=rand)
        backoff: Backoff = "fixed" if self.backoff == "fixed" else "exponential"
        return backoff_delay(
            attempt, backoff=backoff, base=base, cap=cap, jitter=self.jitter, rand=rand
        )

    def _called(self, backoff: BackoffFunction, attempt: int) -> float | None:
        """The delay ``backoff`` gives after ``attempt``, or None (logged) when it is no delay."""
        name = callable_name(backoff)
        try:
            value = backoff(attempt)
        except Exception:
            logger.exception(
                "RetryPolicy backoff %s(%d) raised; using the exponential backoff", name, attempt
            )
            return None
        try:
            seconds = to_seconds(value)
        except TypeError:
            seconds = math.nan
        except OverflowError:  # an int too large for a float
            seconds = math.inf
        if seconds > MAX_DELAY:
            return MAX_DELAY  # a growing function's long waits end at the ceiling
        try:
            return checked_delay(value, f"RetryPolicy backoff {name}({attempt})")
        except (TypeError, ValueError) as exc:
            logger.error("%s; using the exponential backoff", exc)
            return None

    def is_retryable(self, error: BaseException) -> bool:
        """Tell whether ``error`` may be retried at all under this policy."""
        return not any(_matches(entry, error) for entry in self.non_retryable)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Tell whether a run whose attempt number ``attempt`` raised ``error`` goes again."""
        return attempt < self.attempts and self.is_retryable(error)

    def __repr__(self) -> str:
        backoff = (
            f"<function {callable_name(self.backoff)}>"
            if callable(self.backoff)
            else repr(self.backoff)
        )
        return (
            f"RetryPolicy(attempts={self.attempts!r}, backoff={backoff}, "
            f"base_delay={self.base_delay!r}, max_delay={self.max_delay!r}, "
            f"jitter={self.jitter!r}, non_retryable={self.non_retryable!r})"
        )


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

    The result is capped by ``cap`` and ``MAX_DELAY``; with ``jitter`` it is drawn
    uniformly from ``[0, delay]`` ("full jitter"), which spreads a thundering herd of retries.
    """
    if backoff == "fixed":
        delay = base
    else:
        # Past 2**1000 a float overflows; any cap is long reached by then.
        exponent = min(max(attempt - 1, 0), 1000)
        delay = base * 2.0**exponent
    return shaped(delay, cap=cap, jitter=jitter, rand=rand)


def shaped(
    delay: float, *, cap: float | None, jitter: bool, rand: random.Random | None = None
) -> float:
    """``delay`` capped by ``cap`` and by ``MAX_DELAY``, then fully jittered if asked."""
    delay = min(delay, MAX_DELAY if cap is None else cap, MAX_DELAY)
    if jitter:
        delay = (rand or random).uniform(0.0, delay)
    return delay


def callable_name(fn: Any) -> str:
    """A function as its dotted path (``shop.jobs.<lambda>``), for logs and reprs."""
    qualname = getattr(fn, "__qualname__", None)
    if qualname is None:
        return reprlib.repr(fn)
    return f"{getattr(fn, '__module__', None) or '?'}.{qualname}"


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
