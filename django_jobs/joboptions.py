"""Options for job types one does not own: ``DJANGO_JOBS["JOB_OPTIONS"]``.

    DJANGO_JOBS = {
        "JOB_OPTIONS": {
            "wagtail.search.tasks.*": {
                "pool": "search",
                "concurrency_key": "myproject.jobkeys.by_object",
                "retry": {"attempts": 3, "base_delay": 5},
            },
        },
    }

Each key is a job type, or a pattern of job types with ``fnmatch`` wildcards
(``*``, ``?``, ``[...]``), matched against a ``@job``'s type or a ``@task``'s
module path, case-sensitively. Each value sets some of the options ``@job``
takes: ``pool``, ``priority``, ``retry`` (a ``RetryPolicy`` or a dict of its
arguments), ``timeout``, ``concurrency_key`` and ``rate_limit_key`` (a callable,
or the dotted path of one, given a ``@job``'s input or a task's arguments),
``concurrency_limit`` and ``rate_limit``. They replace what the code declares;
what a caller passes to ``start()`` for one run still wins. Where several keys
match a job type, each option comes from the most specific key that sets it:
the job type itself, then the pattern with the most characters that are not
wildcards.

The settings are code: a dotted path in them is imported (by the system check
first, ``problems()``), never a name read from a row.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from . import conf
from .backoff import RetryPolicy
from .names import concurrency_limit, pool_problem
from .ratelimits import parse_rate

OPTIONS = (
    "pool",
    "priority",
    "retry",
    "timeout",
    "concurrency_key",
    "concurrency_limit",
    "rate_limit",
    "rate_limit_key",
)
# The longest pattern: a job type is at most 200 characters.
MAX_PATTERN = 200
PRIORITY_RANGE = (-32768, 32767)
_WILDCARDS = "*?["


def problems() -> list[str]:
    """What is wrong with ``JOB_OPTIONS``, one message per problem (check E015)."""
    entries = conf.merged()["JOB_OPTIONS"]
    if not isinstance(entries, dict):
        return []  # the settings check (E001) says so
    found = []
    for pattern, options in entries.items():
        where = f"JOB_OPTIONS[{pattern!r}]"
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
            found.append(f"{where}: a key is a job type or pattern of 1-{MAX_PATTERN} characters")
            continue
        if not isinstance(options, dict):
            found.append(f"{where} must be a dict of options, got {type(options).__name__}")
            continue
        unknown = sorted(str(name) for name in options if name not in OPTIONS)
        if unknown:
            found.append(
                f"{where} has unknown options {', '.join(unknown)} (known: {', '.join(OPTIONS)})"
            )
        for name in OPTIONS:
            if name in options:
                try:
                    _convert(name, options[name], arguments=False)
                except (TypeError, ValueError, ImportError) as exc:
                    found.append(f"{where}[{name!r}]: {exc}")
        if "rate_limit_key" in options and "rate_limit" not in options:
            found.append(f"{where}: 'rate_limit_key' needs a 'rate_limit' beside it")
    return found


def options_for(job_type: str, *, arguments: bool = False) -> dict[str, Any]:
    """The options ``JOB_OPTIONS`` sets for ``job_type``, converted to ``@job``'s
    forms (``JobHandler``'s fields); empty when nothing matches.

    With ``arguments`` (a task's runs, whose input is ``{"args", "kwargs"}``), the
    key functions are called with the task's arguments rather than the input.
    Entries the check reports as invalid set nothing.
    """
    cache = _caches[arguments]
    found = cache.get(job_type)
    if found is None:
        found = cache[job_type] = _options_for(job_type, arguments)
    return found


def sources(job_type: str) -> dict[str, str]:
    """Which key of ``JOB_OPTIONS`` each option set for ``job_type`` comes from."""
    return {name: pattern for pattern, name, _ in _matches(job_type)}


def in_force(job_type: str) -> list[tuple[str, str, str]]:
    """(option, its value as written, the key of JOB_OPTIONS it comes from) for each
    option set for ``job_type``, for the admin and ``jobstatus``."""
    return [(name, _shown(value), pattern) for pattern, name, value in _matches(job_type)]


def by_key(job_types: Iterable[str]) -> list[dict[str, Any]]:
    """Each valid key of ``JOB_OPTIONS``: its options as written, and which of
    ``job_types`` take at least one option from it now (``jobstatus``)."""
    entries = conf.merged()["JOB_OPTIONS"]
    if not isinstance(entries, dict):
        return []
    types = sorted(set(job_types))
    sources_of = {job_type: set(sources(job_type).values()) for job_type in types}
    found = []
    for key in _matching_any(entries):
        options = {
            name: _shown(value)
            for name, value in entries[key].items()
            if name in OPTIONS and _valid(name, value)
        }
        found.append(
            {
                "key": key,
                "options": options,
                "job_types": [job_type for job_type in types if key in sources_of[job_type]],
            }
        )
    return found


def _matching_any(entries: dict[Any, Any]) -> list[str]:
    return [
        key
        for key, options in entries.items()
        if isinstance(key, str) and isinstance(options, dict) and 0 < len(key) <= MAX_PATTERN
    ]


def _matches(job_type: str) -> list[tuple[str, str, Any]]:
    """(key, option, value as written) of the valid options set for ``job_type``,
    each option from its most specific key, in ``OPTIONS`` order."""
    entries = conf.merged()["JOB_OPTIONS"]
    if not isinstance(entries, dict) or not isinstance(job_type, str):
        return []
    chosen: dict[str, tuple[str, Any]] = {}
    for pattern in sorted(_matching(entries, job_type), key=_specificity):
        for name, value in entries[pattern].items():
            if name in OPTIONS and _valid(name, value):
                chosen[name] = (pattern, value)
    return [(chosen[name][0], name, chosen[name][1]) for name in OPTIONS if name in chosen]


def _options_for(job_type: str, arguments: bool) -> dict[str, Any]:
    return {
        name: _convert(name, value, arguments=arguments) for _, name, value in _matches(job_type)
    }


def _matching(entries: dict[Any, Any], job_type: str) -> list[str]:
    return [key for key in _matching_any(entries) if fnmatch.fnmatchcase(job_type, key)]


def _specificity(pattern: str) -> tuple[bool, int]:
    """Least specific first: patterns before the exact type, then by literal characters."""
    exact = not any(c in pattern for c in _WILDCARDS)
    return (exact, sum(1 for c in pattern if c not in _WILDCARDS))


def _valid(name: str, value: Any) -> bool:
    try:
        _convert(name, value, arguments=False)
    except (TypeError, ValueError, ImportError):
        return False
    return True


def _convert(name: str, value: Any, *, arguments: bool) -> Any:
    """``value`` of option ``name`` as ``JobHandler`` holds it; raises ``TypeError``,
    ``ValueError`` or ``ImportError`` saying what is wrong."""
    if name == "pool":
        problem = pool_problem(value)
        if problem is not None:
            raise ValueError(f"pool {value!r} {problem}")
        return value
    if name == "priority":
        low, high = PRIORITY_RANGE
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"priority must be a whole number from {low} to {high}, got {value!r}")
        return value
    if name == "retry":
        if isinstance(value, RetryPolicy):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"retry must be a RetryPolicy or a dict of its arguments: {value!r}")
        return RetryPolicy(**value)
    if name == "timeout":
        if isinstance(value, timedelta):
            value = value.total_seconds()
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"timeout must be positive seconds or a timedelta, got {value!r}")
        return float(value)
    if name == "concurrency_limit":
        return concurrency_limit(value)
    if name == "rate_limit":
        return parse_rate(value)
    # concurrency_key, rate_limit_key: a callable, or the dotted path of one.
    function = _callable(name, value)
    return _of_arguments(function) if arguments else function


def _callable(name: str, value: Any) -> Callable[..., Any]:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImportError(f"{name} {value!r} cannot be imported: {exc}") from None
    if not callable(value):
        raise TypeError(f"{name} must be a callable or the dotted path of one, got {value!r}")
    return value  # type: ignore[no-any-return]


def _of_arguments(function: Callable[..., Any]) -> Callable[[Any], Any]:
    """``function`` called with a task's arguments, given the run's input."""

    def key(data: Any) -> Any:
        return function(*data.get("args", []), **data.get("kwargs", {}))

    key.__qualname__ = getattr(function, "__qualname__", repr(function))
    return key


def _shown(value: Any) -> str:
    if callable(value) and not isinstance(value, RetryPolicy):
        module = getattr(value, "__module__", "")
        return f"{module}.{getattr(value, '__qualname__', repr(value))}"
    return repr(value)


_caches: dict[bool, dict[str, dict[str, Any]]] = {False: {}, True: {}}


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "DJANGO_JOBS":
        _caches[False] = {}
        _caches[True] = {}
