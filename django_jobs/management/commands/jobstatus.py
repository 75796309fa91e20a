"""``manage.py jobstatus``: per pool, runs by status, lag, throughput, workers and progress."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandParser
from django.db import DatabaseError, connections

from django_jobs import conf, joboptions
from django_jobs.management.arguments import describe, duration, pool_name, positive_float
from django_jobs.management.base import JobsCommand, database_error, first_line
from django_jobs.models import FINISHED_STATUSES
from django_jobs.payloads import terminal_safe
from django_jobs.registry import all_handlers
from django_jobs.snapshot import RunProgress, Snapshot, WorkerState, age, snapshot

# Pools named on a worker's line; the rest are counted ("… and 3 more").
POOLS_SHOWN = 10

COLUMNS = [
    "pool",
    "state",
    "pending",
    "oldest",
    "running",
    "waiting",
    *FINISHED_STATUSES,
    "runs/min",
]


def table(rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def render(shot: Snapshot) -> str:
    """The snapshot as the text ``jobstatus`` prints."""
    window = describe(shot.window)
    header = [c if c not in FINISHED_STATUSES else f"{c}/{window}" for c in COLUMNS] + ["workers"]
    rows = [header]
    for pool in shot.pools:
        rows.append(
            [
                pool.name,
                "paused" if pool.paused else "active",
                str(pool.counts["pending"]),
                age(pool.oldest_pending),
                str(pool.counts["running"]),
                str(pool.counts["waiting"]),
                *(str(pool.counts[status]) for status in FINISHED_STATUSES),
                f"{shot.runs_per_minute(pool):.1f}",
                str(pool.workers),
            ]
        )
    lines = [f"django_jobs at {shot.taken_at:%Y-%m-%d %H:%M:%S %Z}", ""]
    lines += table(rows) if shot.pools else ["No pool has runs, workers or a pool row."]
    for pool in shot.pools:
        if pool.paused_at is not None:
            reason = f": {pool.pause_reason}" if pool.pause_reason else ""
            lines.append(f"  {pool.name} paused for {age(shot.taken_at - pool.paused_at)}{reason}")
        if pool.rate_limited or pool.rate_limit:
            limit = f" (pool limit {pool.rate_limit})" if pool.rate_limit else ""
            lines.append(
                f"  {pool.name} rate-limited: {pool.rate_limited} due runs wait for a window{limit}"
            )
        if pool.held_for_key:
            lines.append(
                f"  {pool.name} held: {pool.held_for_key} pending runs wait for their"
                " concurrency key"
            )
        if pool.held_for_tenant:
            lines.append(
                f"  {pool.name} held: {pool.held_for_tenant} pending runs wait for their"
                " tenant's cap"
            )
        if pool.waiting_for_event:
            lines.append(f"  {pool.name} waiting: {pool.waiting_for_event} runs wait for an event")
    lines += ["", f"Workers ({len(shot.workers)})"]
    for worker in shot.workers:
        flag = "  STALE" if worker.stale else ""
        lines.append(
            f"  {worker.name}  {worker.status}  {_pools(worker)}  concurrency {worker.concurrency}"
            f"  heartbeat {age(worker.heartbeat_age)} ago{flag}"
        )
    if shot.progress:
        lines += ["", "Progress"]
        lines += [_progress(run) for run in shot.progress]
    # Names, reasons and messages come from rows: none may drive the terminal.
    return "\n".join(terminal_safe(line) for line in lines)


def _pools(worker: WorkerState) -> str:
    if worker.pools_unreadable is not None:
        return f"pools unreadable ({worker.pools_unreadable})"
    if not worker.pools:
        return "all pools"
    more = len(worker.pools) - POOLS_SHOWN
    return ", ".join(worker.pools[:POOLS_SHOWN]) + (f" … and {more} more" if more > 0 else "")


def _progress(run: RunProgress) -> str:
    where = f"  #{run.run_id} {run.job_type} ({run.pool})"
    running = f"running {age(run.running_for)}"
    if run.unreadable is not None:
        return f"{where}  progress unreadable ({run.unreadable})  {running}"
    total = "" if run.total is None else f"/{run.total:g}"
    percent = "" if run.percent is None else f" {run.percent:.0f}%"
    message = f"  {run.message}" if run.message else ""
    return f"{where}  {run.done:g}{total}{percent}  {running}{message}"


class Command(JobsCommand):
    help = (
        "Show, per pool, runs by status (finished ones within --window), the age of the "
        "oldest due pending run, runs per minute, live workers and running runs' progress."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--pool",
            dest="pools",
            action="append",
            type=pool_name,
            help="only this pool; repeat for several (default: all)",
        )
        parser.add_argument(
            "--window",
            type=duration,
            default=duration("5m"),
            metavar="AGE",
            help="count finished runs and runs/min over this span: 5m, 1h, 90s (default: 5m)",
        )
        parser.add_argument(
            "--watch",
            nargs="?",
            const=2.0,
            type=positive_float,
            metavar="SECONDS",
            help="print again every SECONDS (default 2) until interrupted",
        )
        parser.add_argument(
            "--json", action="store_true", help="print JSON (one document per line with --watch)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            while True:
                try:
                    shot = snapshot(window=options["window"], pools=options["pools"])
                except DatabaseError as exc:
                    if not options["watch"]:
                        raise database_error(exc) from exc
                    # --watch outlives a database restart: say so, reconnect next time.
                    self.stderr.write(f"cannot read the queue: {terminal_safe(first_line(exc))}")
                    connections[conf.get().DATABASE].close_if_unusable_or_obsolete()
                else:
                    self._show(shot, options)
                if not options["watch"]:
                    return
                self.stdout.flush()
                time.sleep(options["watch"])
        except KeyboardInterrupt:
            return

    def _show(self, shot: Snapshot, options: dict[str, Any]) -> None:
        in_force = job_options()
        if options["json"]:
            self.stdout.write(json.dumps({**shot.as_json(), "job_options": in_force}))
            return
        if options["watch"]:
            # Clear the terminal; piped output gets a blank line between snapshots.
            self.stdout.write("\x1b[H\x1b[2J" if self.stdout.isatty() else "\n", ending="")
        self.stdout.write(render(shot) + render_options(in_force))


def job_options() -> list[dict[str, Any]]:
    """The keys of ``JOB_OPTIONS``, their options, and the job types (``@job``s, and
    the tasks of the modules this process imported) each gives options to."""
    if not conf.merged()["JOB_OPTIONS"]:
        return []
    try:
        from django_jobs.task_lookup import loaded_tasks
    except ImproperlyConfigured:  # no tasks framework installed: no tasks
        return joboptions.by_key(all_handlers())
    return joboptions.by_key([*all_handlers(), *loaded_tasks()])


def render_options(in_force: list[dict[str, Any]]) -> str:
    """The text of ``JOB_OPTIONS`` in force, after the snapshot's (empty without any)."""
    if not in_force:
        return ""
    lines = ["", "", "Options from settings (JOB_OPTIONS)"]
    for entry in in_force:
        options = ", ".join(f"{name}={value}" for name, value in entry["options"].items())
        lines.append(f"  {entry['key']}: {options or 'no valid option'}")
        applies = ", ".join(entry["job_types"]) or "no job type this process knows"
        lines.append(f"    applies to {applies}")
    return "\n".join(terminal_safe(line) for line in lines)
