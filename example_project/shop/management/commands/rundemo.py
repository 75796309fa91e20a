"""``manage.py rundemo``: enqueue an order pipeline, drain it with real workers, report."""

from __future__ import annotations

import argparse
import signal
import time
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from shop import orders, report
from shop.workers import WorkerProcesses

POLL_SECONDS = 0.2
# A --burst worker exits once nothing is due, even when retries are scheduled a
# moment later; the demo then starts another round of workers for them.
MAX_ROUNDS = 20


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Turn SIGTERM into SystemExit, so the finally blocks stop the workers (and atexit the
    embedded server) as they do on Ctrl-C."""
    raise SystemExit(128 + signum)


class Command(BaseCommand):
    help = "Enqueue a few hundred shop orders' runs, drain them with runjobworker, summarize."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--runs",
            type=positive_int,
            default=300,
            metavar="N",
            help="runs to enqueue (default: 300)",
        )
        parser.add_argument(
            "--workers",
            type=positive_int,
            default=2,
            metavar="N",
            help="runjobworker processes (default: 2)",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=4,
            metavar="N",
            help="threads per worker process (default: 4)",
        )
        parser.add_argument(
            "--timeout",
            type=positive_int,
            default=120,
            metavar="S",
            help="seconds to wait for the runs to finish (default: 120)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
        try:
            self._demo(options)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _demo(self, options: dict[str, Any]) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        cleared = orders.clear_demo_runs()
        db = connection.settings_dict
        host = db["HOST"] or db.get("OPTIONS", {}).get("host", "")
        self.stdout.write(
            f"Database {db['NAME']} on {host}"
            + (f"; cleared {cleared} old rows" if cleared else "")
        )

        started = time.monotonic()
        total = len(orders.enqueue_orders(options["runs"]))
        self.stdout.write(f"Enqueued {total} runs in {time.monotonic() - started:.2f}s")

        workers = WorkerProcesses(
            settings.BASE_DIR / "manage.py",
            orders.pools(),
            processes=options["workers"],
            concurrency=options["concurrency"],
            verbosity=max(options["verbosity"] - 1, 0),
        )
        self.stdout.write("Workers: " + " ".join(workers.command[1:]) + f"  (x{workers.processes})")
        started = time.monotonic()
        try:
            rounds = self._drain(workers, deadline=started + options["timeout"])
            if not report.Progress.read().unfinished:
                workers.wait(timeout=10)  # burst workers exit by themselves once idle
        except KeyboardInterrupt:
            raise CommandError("interrupted; the workers were stopped", returncode=130) from None
        finally:
            workers.stop()
        elapsed = time.monotonic() - started
        self._summarize(elapsed, rounds, workers)

        progress = report.Progress.read()
        if workers.failed or progress.unfinished:
            raise CommandError(
                f"demo incomplete: worker exit codes {workers.exit_codes}, "
                f"{progress.unfinished} runs unfinished"
            )

    def _drain(self, workers: WorkerProcesses, *, deadline: float) -> int:
        """Run rounds of burst workers until every run finished; return the rounds used."""
        rounds = 0
        last_line = 0.0
        tty = self.stdout.isatty()
        while True:
            progress = report.Progress.read()
            if tty or time.monotonic() - last_line >= 1.0 or not progress.unfinished:
                # On a terminal, redraw in place: return, bar, clear to the end of the line.
                line = f"\r{progress.bar()}\033[K" if tty else progress.bar()
                self.stdout.write(line, ending="" if tty else "\n")
                self.stdout.flush()
                last_line = time.monotonic()
            if not progress.unfinished or time.monotonic() > deadline:
                break
            if workers.reap():
                if workers.failed or rounds >= MAX_ROUNDS or not self._retries_due_soon(deadline):
                    break
                workers.start()
                rounds += 1
            time.sleep(POLL_SECONDS)
        if tty:
            self.stdout.write("")
        return rounds

    def _retries_due_soon(self, deadline: float) -> bool:
        """Wait for the next pending run to come due (before ``deadline``); False if none."""
        wait = report.seconds_until_next_due()
        if wait is None or time.monotonic() + wait > deadline:
            return False
        time.sleep(max(wait, 0.0))
        return True

    def _summarize(self, elapsed: float, rounds: int, workers: WorkerProcesses) -> None:
        progress = report.Progress.read()
        made, retries = report.attempts()
        out = self.stdout.write
        out("")
        out(self.style.MIGRATE_HEADING("Runs by status"))
        for line in report.table(
            ["status", "runs"],
            [[s, str(progress.counts[s])] for s in report.STATUS_ORDER if progress.counts[s]],
        ):
            out(line)
        out("")
        out(self.style.MIGRATE_HEADING("Runs by job type and status"))
        for line in report.by_type_and_status():
            out(line)
        out("")
        out(self.style.MIGRATE_HEADING("Failed runs"))
        for line in report.failures() or ["  none"]:
            out(line)
        out("")
        waits = ", ".join(f"{label} {ms:.0f} ms" for label, ms in report.queue_wait_ms().items())
        facts = [
            ("Attempts", f"{made} ({retries} retries)"),
            ("Queue wait", f"{waits} (enqueue to first attempt)"),
            (
                "Workers",
                f"{rounds} round(s) of {workers.processes}, exit codes {workers.exit_codes}",
            ),
            ("Elapsed", f"{elapsed:.2f} s, {progress.finished / elapsed:.1f} runs/s"),
        ]
        busy = report.processing_seconds()
        if busy:
            rate = progress.finished / busy
            facts.append(
                ("Processing", f"{busy:.2f} s, {rate:.1f} runs/s (first claim to last end)")
            )
        for label, text in facts:
            out(f"{label:<12}{text}")
