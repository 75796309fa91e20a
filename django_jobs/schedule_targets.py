"""What schedules start: their targets (a ``@job`` or a ``django.tasks`` task), and the
schedules in force, from the code and from a run-time schedule's row."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .api import start_handler
from .exceptions import UnknownJobType
from .models import JobRun
from .registry import JobHandler, all_handlers
from .schedules import (
    MAX_CRON,
    Entry,
    Schedule,
    Target,
    entries,
    idempotency_key,
    other_target,
    schedule_input,
)


def find_target(job_type: str, *, importing: bool = False) -> Target | None:
    """What ``job_type`` names as a schedule's target: a ``@job``, or a task.

    ``importing`` may import a task's module (for names written in settings); a
    name read from a row is only looked up among the modules already imported.
    """
    handler = all_handlers().get(job_type)
    if handler is not None:
        return job_target(handler)
    return other_target(job_type, importing=importing)


def job_target(handler: JobHandler) -> Target:
    """A ``@job`` as a schedule's target: its runs are triggered by the schedule."""

    def start(input: Any, name: str, tick: datetime) -> JobRun:
        return start_handler(
            handler,
            input,
            trigger=("schedule", name),
            run_at=tick,
            idempotency_key=idempotency_key(name, tick),
            scheduled=True,
        )

    return Target(
        job_type=handler.job_type,
        pool=handler.pool,
        kind="job",
        check_input=lambda value: schedule_input(value, what="input"),
        start=start,
    )


def code_entries(pools: list[str] | None) -> list[Entry]:
    """The schedules declared in code (of jobs in ``pools``, or all)."""
    return entries(all_handlers(), pools, resolve=lambda name: other_target(name, importing=True))


def runtime_entry(row: Mapping[str, Any]) -> Entry:
    """The schedule a run-time row defines, its input aside; ``ValueError`` (or
    ``UnknownJobType``) when its row holds what no schedule can be, or a target this
    process does not know.

    The input is not part of it: it is read when a tick of the row fires
    (``schedule_rows.read_input()``), so that what is kept of every schedule, and
    read at every reread, stays small whatever the inputs are.
    """
    cron = row["cron"]
    if isinstance(cron, str) and len(cron) > MAX_CRON:
        raise ValueError(f"its cron expression is longer than {MAX_CRON} characters")
    schedule = Schedule(cron, timezone=row["timezone"] or None, missed=row["missed"])
    target = find_target(row["job_type"])
    if target is None:
        raise UnknownJobType(
            f"schedule {str(row['name'])[:200]!r} targets {str(row['job_type'])[:200]!r}, "
            "which this process does not know (a @job type, or a task whose module is imported)"
        )
    return Entry(row["name"], target.job_type, target.pool, schedule, runtime=True)
