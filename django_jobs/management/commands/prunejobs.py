"""``manage.py prunejobs``: delete finished runs and their steps, in batches."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_jobs.management.arguments import describe, duration, positive_int
from django_jobs.management.base import JobsCommand
from django_jobs.models import FINISHED_STATUSES
from django_jobs.retention import prune

DEFAULT_RETENTION = "30d"


class Command(JobsCommand):
    help = (
        "Delete runs that finished longer ago than --older-than, with their child runs and "
        "steps, in batches. Runs with unfinished children are kept. Rows of rate limits "
        "that hold nothing any more are deleted too."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration,
            default=duration(DEFAULT_RETENTION),
            metavar="AGE",
            help=f"finished at least this long ago: 30d, 12h, 90m, 45s, 2w "
            f"(default: {DEFAULT_RETENTION})",
        )
        parser.add_argument(
            "--status",
            dest="statuses",
            action="append",
            choices=sorted(FINISHED_STATUSES),
            help="only runs that ended with this status; repeat for several (default: all four)",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            metavar="N",
            help="top-level runs (and rate-limit rows) deleted per transaction (default: 1000)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        statuses = options["statuses"] or sorted(FINISHED_STATUSES)
        result = prune(
            options["older_than"],
            statuses=statuses,
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
        )
        verb = "Would delete" if options["dry_run"] else "Deleted"
        self.stdout.write(
            f"{verb} {result.runs} runs and {result.steps} steps "
            f"(finished over {describe(options['older_than'])} ago, status {', '.join(statuses)}; "
            f"{result.batches} batches)."
        )
        if result.kept_open:
            self.stdout.write(f"Kept {result.kept_open} finished runs with unfinished children.")
        self.stdout.write(
            f"{verb} {result.rate_limits} rate-limit rows that held nothing (no start in "
            "their window, no pending or running run under them)."
        )
