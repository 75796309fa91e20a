"""The one reader of ``settings.DJANGO_JOBS``: defaults and validation."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "POLL_INTERVAL": 1.0,
    "HEARTBEAT_INTERVAL": 10.0,
    "STALE_THRESHOLD": 60.0,
    "SHUTDOWN_TIMEOUT": 30.0,
    "CANCEL_GRACE": 30.0,
    "MAX_INPUT_BYTES": 1_048_576,
    "LISTEN_NOTIFY": True,
    "PREPARED_STATEMENTS": True,
    # name -> {"job_type", "cron", "timezone", "missed", "input"}; each entry is
    # checked by schedules.entry_problems (checks E009-E013).
    "SCHEDULES": {},
    # pool -> rate ("100/m"): at most so many runs of the pool start per period,
    # across every worker (checked by check E014).
    "RATE_LIMITS": {},
    # How many runs of one tenant may run at once in a pool, across the fleet:
    # None (no cap), a number (every pool), or a dict of numbers by pool with
    # "*" for the pools it does not name.
    "TENANT_CONCURRENCY": None,
    # Whether claims take turns across tenants (storage.turns): a tenant's burst
    # waits for other tenants' runs rather than before them.
    "FAIR_TURNS": True,
    # Test mode: a run started runs in the starting process when the transaction
    # that started it commits (at once outside one), as ``testing.drain()`` runs it.
    "RUN_ON_COMMIT": False,
    # How long finished runs are kept: workers delete older ones (with their
    # families, in small batches; ``retention.prune``). None keeps them all.
    "RETENTION": timedelta(days=30),
    # Options for job types one does not own, by job type or task path with
    # wildcards (``fnmatch``): {"wagtail.*": {"pool": "wagtail", ...}}; each
    # entry is checked by ``joboptions.problems`` (check E015).
    "JOB_OPTIONS": {},
}

DURATION_KEYS = frozenset(
    {"POLL_INTERVAL", "HEARTBEAT_INTERVAL", "STALE_THRESHOLD", "SHUTDOWN_TIMEOUT", "CANCEL_GRACE"}
)
# The longest duration setting: a longer one is a mistake (and near 292 years a
# thread's wait overflows).
MAX_DURATION = 7 * 86_400.0


def to_seconds(value: Any) -> float:
    """Return a duration given as seconds (a number) or a ``timedelta`` as float seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected seconds or a timedelta, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class JobsSettings:
    DATABASE: str
    POLL_INTERVAL: float
    HEARTBEAT_INTERVAL: float
    STALE_THRESHOLD: float
    SHUTDOWN_TIMEOUT: float
    CANCEL_GRACE: float
    MAX_INPUT_BYTES: int
    LISTEN_NOTIFY: bool
    PREPARED_STATEMENTS: bool
    SCHEDULES: dict[str, Any]
    RATE_LIMITS: dict[str, Any]
    TENANT_CONCURRENCY: int | dict[str, int] | None
    FAIR_TURNS: bool
    RUN_ON_COMMIT: bool
    RETENTION: float | None
    JOB_OPTIONS: dict[str, Any]


def user_settings() -> dict[str, Any]:
    """Return ``settings.DJANGO_JOBS`` as given (an empty dict when unset)."""
    value = getattr(settings, "DJANGO_JOBS", None)
    return {} if value is None else value


def is_given(key: str) -> bool:
    """Whether ``settings.DJANGO_JOBS`` sets ``key`` (rather than leaving it to the default)."""
    given = user_settings()
    return isinstance(given, dict) and key in given


def merged() -> dict[str, Any]:
    """The known keys of ``settings.DJANGO_JOBS`` over the defaults, as given (unconverted)."""
    given = user_settings()
    if not isinstance(given, dict):
        return dict(DEFAULTS)
    return {**DEFAULTS, **{k: v for k, v in given.items() if k in DEFAULTS}}


def seconds_or_none(value: Any) -> float | None:
    """A valid duration setting in seconds, or None when it is invalid (see ``problems``)."""
    try:
        seconds = to_seconds(value)
    except TypeError:
        return None
    return seconds if 0 < seconds <= MAX_DURATION else None


# The shortest RETENTION: a caller in ``JobRun.wait()`` reads a run within about
# a second of its end, and must find it. The longest: past it, the cutoff
# (now minus the retention) leaves the dates a database holds.
MIN_RETENTION = 60.0
MAX_RETENTION = timedelta(days=36_500).total_seconds()


def retention_or_none(value: Any) -> float | None:
    """A RETENTION in seconds, or None when it is None or invalid (see ``problems``);
    raises ``TypeError`` when it is not a duration."""
    if value is None:
        return None
    seconds = to_seconds(value)
    return seconds if MIN_RETENTION <= seconds <= MAX_RETENTION else None  # NaN fails both


def problems() -> list[str]:
    """Describe every invalid key or value of ``settings.DJANGO_JOBS`` (used by the checks)."""
    given = user_settings()
    if not isinstance(given, dict):
        return [f"DJANGO_JOBS must be a dict, not {type(given).__name__}"]
    found = [f"unknown key {key!r}" for key in given if key not in DEFAULTS]
    values = merged()
    for key in sorted(DURATION_KEYS):
        try:
            if not 0 < to_seconds(values[key]) <= MAX_DURATION:  # NaN fails both
                found.append(f"{key} must be positive and at most a week, got {values[key]!r}")
        except TypeError:
            found.append(f"{key} must be seconds or a timedelta, got {values[key]!r}")
    if not isinstance(values["DATABASE"], str):
        found.append(f"DATABASE must be a database alias, got {values['DATABASE']!r}")
    max_bytes = values["MAX_INPUT_BYTES"]
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        found.append(f"MAX_INPUT_BYTES must be a positive integer, got {max_bytes!r}")
    for key in ("LISTEN_NOTIFY", "PREPARED_STATEMENTS", "FAIR_TURNS", "RUN_ON_COMMIT"):
        if not isinstance(values[key], bool):
            found.append(f"{key} must be True or False, got {values[key]!r}")
    if not isinstance(values["SCHEDULES"], dict):
        found.append(f"SCHEDULES must be a dict of schedules by name, got {values['SCHEDULES']!r}")
    found += _cap_problems(values["TENANT_CONCURRENCY"])
    retention = values["RETENTION"]
    if retention is not None:
        try:
            if retention_or_none(retention) is None:
                found.append(
                    f"RETENTION must be from a minute to 100 years (or None), got {retention!r}"
                )
        except TypeError:
            found.append(f"RETENTION must be seconds, a timedelta or None, got {retention!r}")
    if not isinstance(values["JOB_OPTIONS"], dict):
        found.append(
            f"JOB_OPTIONS must be a dict of options by job type, got {values['JOB_OPTIONS']!r}"
        )
    return found


# The most runs of one tenant a cap may allow at once (a slot each).
MAX_TENANT_CAP = 10_000


def _cap_problems(value: Any) -> list[str]:
    """What is wrong with ``TENANT_CONCURRENCY``: None, a cap, or caps by pool."""
    if value is None:
        return []
    entries = value if isinstance(value, dict) else {"*": value}
    found = []
    for pool, cap in entries.items():
        where = "" if not isinstance(value, dict) else f"[{pool!r}]"
        if not isinstance(pool, str) or not pool:
            found.append(f"TENANT_CONCURRENCY's keys must be pool names or '*', got {pool!r}")
        elif isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_TENANT_CAP:
            found.append(
                f"TENANT_CONCURRENCY{where} must be a whole number of runs from 1 to "
                f"{MAX_TENANT_CAP}, got {cap!r}"
            )
    return found


def tenant_cap(pool: str) -> int | None:
    """How many runs of one tenant may run at once in ``pool`` (None: no cap)."""
    named, others = tenant_caps()
    return named.get(pool, others)


def tenant_caps() -> tuple[dict[str, int], int | None]:
    """The caps of ``TENANT_CONCURRENCY``: by the pools it names, and for the others.
    An invalid setting caps nothing (the settings check reports it)."""
    global _caps
    if _caps is None:
        value = get().TENANT_CONCURRENCY
        if value is None or _cap_problems(value):
            _caps = ({}, None)
        elif isinstance(value, dict):
            _caps = ({pool: cap for pool, cap in value.items() if pool != "*"}, value.get("*"))
        else:
            _caps = ({}, value)
    return _caps


_caps: tuple[dict[str, int], int | None] | None = None
_cache: JobsSettings | None = None


def get() -> JobsSettings:
    """Return the effective settings, defaults filled in (cached until settings change)."""
    global _cache
    if _cache is None:
        values = merged()
        for key in DURATION_KEYS:
            values[key] = to_seconds(values[key])
        # An invalid retention keeps everything (the settings check reports it).
        try:
            values["RETENTION"] = retention_or_none(values["RETENTION"])
        except TypeError:
            values["RETENTION"] = None
        _cache = JobsSettings(**values)
    return _cache


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cache, _caps
    if setting == "DJANGO_JOBS":
        _cache = _caps = None
