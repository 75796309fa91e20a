"""``manage.py jobpool pause|resume|list|forget``: stop and restart claiming from pools."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_jobs.management.arguments import pool_name
from django_jobs.management.base import JobsCommand
from django_jobs.payloads import cut, terminal_safe
from django_jobs.pools import (
    MAX_PAUSE_REASON,
    PoolInUse,
    forget_pool,
    pause_pool,
    paused_pools,
    reason_problem,
    resume_pool,
)


def pause_reason(value: str) -> str:
    problem = reason_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"the reason {problem}")
    return value


class Command(JobsCommand):
    help = (
        "Pause a pool (workers stop claiming its pending runs; running runs finish), "
        "resume it, list the paused pools, or forget an empty pool."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        pause = actions.add_parser("pause", help="stop workers claiming runs of these pools")
        pause.add_argument("pools", nargs="+", type=pool_name, metavar="POOL")
        pause.add_argument(
            "--reason", default="", type=pause_reason, help="shown in the admin and in jobstatus"
        )
        resume = actions.add_parser("resume", help="let workers claim runs of these pools again")
        resume.add_argument("pools", nargs="+", type=pool_name, metavar="POOL")
        actions.add_parser("list", help="list the paused pools")
        forget = actions.add_parser(
            "forget",
            help="forget pools without unfinished runs or live workers (jobstatus and the "
            "admin stop listing them)",
        )
        forget.add_argument("pools", nargs="+", type=pool_name, metavar="POOL")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            self._list()
            return
        if action == "forget":
            self._forget(options["pools"])
            return
        for name in options["pools"]:
            if action == "pause":
                changed = pause_pool(name, reason=options["reason"])
                self.stdout.write(
                    f"Paused {name!r}." if changed else f"{name!r} was paused already."
                )
            else:
                changed = resume_pool(name)
                self.stdout.write(f"Resumed {name!r}." if changed else f"{name!r} was not paused.")

    def _list(self) -> None:
        paused = paused_pools()
        if not paused:
            self.stdout.write("No pool is paused.")
        for pool in paused.values():
            # The row may hold anything (written before names and reasons were
            # checked, or by hand): cut, and escaped for the terminal.
            reason = f": {cut(pool.pause_reason, MAX_PAUSE_REASON)}" if pool.pause_reason else ""
            since = f"{pool.paused_at:%Y-%m-%d %H:%M:%S %Z}" if pool.paused_at else "?"
            self.stdout.write(terminal_safe(f"{pool.name} paused since {since}{reason}"))

    def _forget(self, names: list[str]) -> None:
        for name in names:
            try:
                forgotten = forget_pool(name)
            except PoolInUse as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"Forgot {name!r}." if forgotten else f"{name!r} is not known.")
