"""Periodic schedules: ``Schedule``, the schedules in force, and which ticks to run. No SQL.

A schedule is declared on a job (``@job(..., schedule=...)``, named after its
job type) or in ``DJANGO_JOBS["SCHEDULES"]`` (named by its key), or added at
run time (``add_schedule()``, the admin; its row is its definition). The
database side, one run per tick across every worker, is ``scheduler.py``.

A schedule starts runs of its *target*: a ``@job`` or a ``django.tasks`` task
(``Target``). Tasks are found through the lookups the tasks backend adds
(``add_target_lookup``), since this module cannot know them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import conf
from .cron import Cron, parse
from .payloads import normalize

logger = logging.getLogger(__name__)

MISSED_POLICIES = ("skip", "catch_up")
SETTINGS_KEYS = ("job_type", "cron", "timezone", "missed", "input")
MAX_NAME = 200
MAX_CRON = 1000  # characters of a run-time schedule's cron expression
# A tick first handled more than this after its instant was missed: no worker
# was scheduling then (all down, or the database unreachable). Workers handle a
# tick within moments, so only downtime makes a tick this late.
MISSED_AFTER = timedelta(seconds=60)
# At most this many runs for the ticks missed by one schedule (the latest
# ones, under missed="catch_up"): years of downtime do not make millions of runs.
CATCH_UP_LIMIT = 100
# Ticks older than this are not looked at, neither run nor counted as missed:
# the count of ticks missed walks the days in between, and a row claiming a
# latest tick in year 1 would make every look at it (a worker's, the admin's
# resume preview) walk 740,000 days. Ten years is 3,653 of them, a few ms.
LOOKBACK = timedelta(days=3653)


@dataclass(frozen=True)
class Schedule:
    """When to start runs of a job: a cron expression in a time zone, and a missed-tick policy.

    ``timezone`` is an IANA name (or a ``ZoneInfo``); ``None`` means
    ``settings.TIME_ZONE`` when the schedule is used. ``missed`` is ``"skip"``
    or ``"catch_up"``. Every run gets ``input``: a JSON value, ``{}`` when
    ``None`` (as with ``start()``).
    """

    cron: str
    _: KW_ONLY
    timezone: str | None = None
    missed: str = "skip"
    input: Any = None
    parsed: Cron = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parsed", parse(self.cron))
        if isinstance(self.timezone, ZoneInfo):
            object.__setattr__(self, "timezone", self.timezone.key)
        if self.timezone is not None:
            zone_problem = timezone_problem(self.timezone)
            if zone_problem is not None:
                raise ValueError(zone_problem)
        if self.missed not in MISSED_POLICIES:
            raise ValueError(
                f"missed must be one of {', '.join(map(repr, MISSED_POLICIES))}, "
                f"got {self.missed!r}"
            )
        object.__setattr__(self, "input", schedule_input(self.input, what="schedule input"))

    @property
    def zone(self) -> ZoneInfo:
        """The zone the cron fields are matched in (``settings.TIME_ZONE`` by default)."""
        from django.conf import settings

        return ZoneInfo(self.timezone or settings.TIME_ZONE or "UTC")

    def next_after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant``, as an aware UTC datetime."""
        return self.parsed.next_after(instant, self.zone)


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a run-time schedule, or None.

    As for pools: whitespace and control characters are refused, since
    ``"nightly "`` would look like ``"nightly"`` in every listing.
    """
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "contains whitespace or a control character"
    return None


def timezone_problem(name: object) -> str | None:
    """Why ``name`` is not a time zone ``zoneinfo`` knows, or None."""
    if not isinstance(name, str) or not name:
        return f"timezone must be an IANA time zone name, got {name!r}"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {name!r}"
    return None


def schedule_input(value: object, *, what: str) -> Any:
    """Return a schedule's input as its runs get it, or raise ``ValueError``.

    As with ``start()``: any JSON value, and ``None`` means ``{}``.
    """
    return normalize({} if value is None else value, what=what)


@dataclass(frozen=True)
class Entry:
    """A schedule in force: its name, the job type it starts, and the job's pool.

    ``runtime``: added at run time, so its row is its definition (this entry is
    the definition as last read from it).
    """

    name: str
    job_type: str
    pool: str
    schedule: Schedule
    runtime: bool = False


@dataclass(frozen=True)
class Target:
    """What a schedule starts, as this process knows it: a ``@job`` or a ``django.tasks`` task."""

    job_type: str  # a job type, or a task's module path
    pool: str
    kind: str  # "job" or "task"
    # The schedule's input as its runs get it; ValueError when they could not take it.
    check_input: Callable[[Any], Any]
    # Start the run of one tick: (input, schedule name, tick) -> the JobRun.
    start: Callable[[Any, str, datetime], Any]


# Each finds a target no @job registered (a task, by its module path), or None.
# With ``importing``, it may import the target's module: only for names written
# in code (settings); a name read from a row is looked up among what is imported.
TargetLookup = Callable[[str, bool], Target | None]
_lookups: list[TargetLookup] = []


def add_target_lookup(lookup: TargetLookup) -> None:
    """Let ``lookup(name, importing)`` supply targets that are not ``@job`` types."""
    if lookup not in _lookups:
        _lookups.append(lookup)


def other_target(name: str, *, importing: bool = False) -> Target | None:
    """The target ``name`` names that is not a ``@job`` (a task), or None."""
    for lookup in list(_lookups):
        found = lookup(name, importing)
        if found is not None:
            return found
    return None


class Job(Protocol):
    """What a schedule needs of a registered job (``registry.JobHandler``)."""

    @property
    def job_type(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def schedule(self) -> Schedule | None: ...


def entries(
    handlers: Mapping[str, Job],
    pools: list[str] | None = None,
    *,
    resolve: Callable[[str], Target | None] | None = None,
) -> list[Entry]:
    """Return the schedules declared in code (of jobs in ``pools``, or all), sorted by name.

    ``handlers`` are the registered jobs by job type (``registry.all_handlers()``);
    ``resolve`` finds the other targets a settings entry may name (tasks).
    Settings entries that are invalid or name an unknown target are left out:
    the system checks report them.
    """
    found = {
        handler.job_type: Entry(handler.job_type, handler.job_type, handler.pool, handler.schedule)
        for handler in handlers.values()
        if handler.schedule is not None
    }
    for name, spec in _settings_schedules().items():
        if name in found or entry_problems(name, spec):
            continue
        job: Job | Target | None = handlers.get(spec["job_type"])
        if job is None and resolve is not None:
            job = resolve(spec["job_type"])
        if job is None:
            continue
        try:
            schedule = from_settings(spec)
            if isinstance(job, Target):
                schedule = replace(schedule, input=job.check_input(schedule.input))
        except ValueError:
            continue  # a task's input that does not fit it: E009
        found[name] = Entry(name, job.job_type, job.pool, schedule)
    return [entry for _, entry in sorted(found.items()) if pools is None or entry.pool in pools]


def code_names(handlers: Mapping[str, Job]) -> set[str]:
    """The names schedules declared in code hold (valid or not): run-time ones may not take them."""
    names = {handler.job_type for handler in handlers.values() if handler.schedule is not None}
    return names | {name for name in _settings_schedules() if isinstance(name, str)}


def from_settings(spec: dict[str, Any]) -> Schedule:
    return Schedule(
        spec["cron"],
        timezone=spec.get("timezone"),
        missed=spec.get("missed", "skip"),
        input=spec.get("input"),
    )


def _settings_schedules() -> dict[str, Any]:
    # Read as given, not through conf.get(): the checks read them while other
    # settings may be invalid (and reported beside them).
    schedules = conf.merged()["SCHEDULES"]
    return schedules if isinstance(schedules, dict) else {}


def entry_problems(name: object, spec: object) -> list[tuple[str, str]]:
    """The problems of one ``SCHEDULES`` entry as ``(check id, message)``; job type aside."""
    where = f"DJANGO_JOBS['SCHEDULES'][{name!r}]"
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        return [("E009", f"{where}: a schedule name must be a string of 1-{MAX_NAME} characters")]
    if not isinstance(spec, dict):
        return [("E009", f"{where} must be a dict, not {type(spec).__name__}")]
    found = [("E009", f"{where}: unknown key {key!r}") for key in spec if key not in SETTINGS_KEYS]
    if not isinstance(spec.get("job_type"), str):
        found.append(
            ("E009", f"{where}: 'job_type' must be a job type, got {spec.get('job_type')!r}")
        )
    if spec.get("missed", "skip") not in MISSED_POLICIES:
        found.append(
            ("E009", f"{where}: 'missed' must be 'skip' or 'catch_up', got {spec['missed']!r}")
        )
    try:
        schedule_input(spec.get("input"), what="'input'")
    except ValueError as exc:
        found.append(("E009", f"{where}: {exc}"))
    try:
        parse(spec.get("cron"))  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        found.append(("E010", f"{where}: {exc}"))
    if spec.get("timezone") is not None:
        zone_problem = timezone_problem(spec["timezone"])
        if zone_problem is not None:
            found.append(("E011", f"{where}: {zone_problem}"))
    return found


def settings_problems(
    handlers: Mapping[str, Job], resolve: Callable[[str], Target | None] | None = None
) -> list[tuple[str, str]]:
    """Every problem of ``DJANGO_JOBS["SCHEDULES"]`` as ``(check id, message)``, given
    the registered jobs by job type and how to find other targets (tasks)."""
    found: list[tuple[str, str]] = []
    for name, spec in _settings_schedules().items():
        problems = entry_problems(name, spec)
        found.extend(problems)
        if problems:
            continue
        where = f"DJANGO_JOBS['SCHEDULES'][{name!r}]"
        target = None
        if spec["job_type"] not in handlers and resolve is not None:
            target = resolve(spec["job_type"])
        if spec["job_type"] not in handlers and target is None:
            found.append(
                (
                    "E012",
                    f"{where}: no job is registered as {spec['job_type']!r}, and no "
                    "django.tasks task has that path",
                )
            )
        if target is not None:
            try:
                target.check_input(schedule_input(spec.get("input"), what="'input'"))
            except ValueError as exc:
                found.append(("E009", f"{where}: {exc}"))
        collision = handlers.get(name)
        if collision is not None and collision.schedule is not None:
            found.append(("E013", f"{where}: the name is taken by the schedule of @job({name!r})"))
    return found


@dataclass(frozen=True)
class Plan:
    """The ticks due at ``now``: which get a run, and the latest (to be stored)."""

    run: list[datetime]
    latest: datetime | None
    missed: int  # due ticks that get no run


def plan(schedule: Schedule, after: datetime, now: datetime) -> Plan:
    """Decide the runs for the ticks after ``after`` up to ``now`` (pure: no database).

    A tick more than ``MISSED_AFTER`` old is missed: ``skip`` runs none of them,
    ``catch_up`` runs each, oldest first, up to the latest ``CATCH_UP_LIMIT``.
    Ticks more than ``LOOKBACK`` old are neither run nor counted.
    """
    due, total = latest_ticks(schedule, max(after, now - LOOKBACK), now, CATCH_UP_LIMIT)
    if not due:
        return Plan([], None, 0)
    if schedule.missed == "catch_up":
        chosen = due
    else:
        chosen = [tick for tick in due if now - tick <= MISSED_AFTER]
    return Plan(chosen, due[-1], total - len(chosen))


def latest_ticks(
    schedule: Schedule, after: datetime, now: datetime, limit: int
) -> tuple[list[datetime], int]:
    """The latest ``limit`` ticks in ``(after, now]``, oldest first; and how many there are.

    After long downtime the start is found by bisection on the instant, each
    probe counting at most ``limit + 1`` ticks, and the total is counted a day
    at a time, so the cost does not grow with the number of ticks missed.
    """
    ticks = _ticks(schedule, after, now, limit + 1)
    if len(ticks) <= limit:
        return ticks, len(ticks)
    # More than ``limit`` ticks in (low, now]; at most ``limit`` in (high, now].
    low, high = after, now
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if len(_ticks(schedule, middle, now, limit + 1)) > limit:
            low = middle
        else:
            high = middle
    total = schedule.parsed.count(after, now, schedule.zone)
    return _ticks(schedule, low, now, limit + 1)[-limit:], total


def _ticks(schedule: Schedule, after: datetime, now: datetime, count: int) -> list[datetime]:
    ticks: list[datetime] = []
    tick = schedule.next_after(after)
    while tick <= now and len(ticks) < count:
        ticks.append(tick)
        tick = schedule.next_after(tick)
    return ticks


def idempotency_key(name: str, tick: datetime) -> str:
    """The run's key for ``tick``: one run per schedule and instant (a unique constraint)."""
    return f"schedule:{name}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
