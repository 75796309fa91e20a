"""What ``runjobworker`` writes on a project's own logging: one line per finished run
and one per failed attempt, its traceback once, nothing of Django's tasks framework
said twice, on one stream and in order; DEBUG on and off, ``-v 0``, a LOGGING of the
project's own; ``@job`` handlers and ``@task`` functions, sync and async."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from django_jobs import cancel, start
from django_jobs.models import JobRun
from django_jobs.tasks_backend import run_id
from tests.helpers import ROOT, wait_until, worker_env
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

# A line of the worker's own handler, and one of the project's LOGGING of logs_settings.
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
STAMPED = re.compile(STAMP.pattern + r"(?P<level>[A-Z]+) (?P<name>\S+) ")
PLAIN = re.compile(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<name>django\S*) ")
OUTCOME = re.compile(r"run=(?P<run>\d+) type=\S+ outcome=(?P<outcome>\w+) attempt=(?P<attempt>\d+)")
TRACEBACK = "Traceback (most recent call last):"


@dataclass
class Record:
    level: str
    name: str
    line: str
    more: list[str] = field(default_factory=list)  # the lines that follow it (a traceback)


def records(text: str, pattern: re.Pattern[str]) -> list[Record]:
    """The records of a log, each with the lines that follow it; no line comes first."""
    found: list[Record] = []
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            found.append(Record(match["level"], match["name"], line))
        else:
            assert found, f"a line before any record: {line!r}"
            found[-1].more.append(line)
    return found


# What each run's lines say, in order: (level, outcome, attempt).
Said = list[tuple[str, str, int]]
COMPLETED: Said = [("INFO", "completed", 1)]
RETRIED: Said = [("WARNING", "retry", 1), ("INFO", "completed", 2)]


def start_runs() -> tuple[dict[int, Said], Callable[[], None]]:
    """Runs of every kind, with the lines each must have; and what to do once the
    worker runs them (cancel the cooperative run)."""
    said: dict[int, Said] = {}

    def job(job_type: str, lines: Said, data: dict[str, Any] | None = None) -> JobRun:
        run = start(job_type, data or {})
        said[run.pk] = lines
        return run

    def task(result: Any, lines: Said) -> None:
        said[run_id(result.id)] = lines

    job("tests.noop", COMPLETED)
    job("tests.flaky", RETRIED, {"succeed_on": 2})
    job("tests.permanent", [("ERROR", "failed", 1)])
    job("tests.slow", [("ERROR", "timed_out", 1)], {"seconds": 1})
    stubborn = job("tests.cooperative", [("INFO", "canceled", 1)], {"seconds": 60})
    job("tests.async_echo", COMPLETED)
    job("tests.async_three_steps", RETRIED, {"fail_c_until": 2})
    job(
        "tests.async_three_steps",
        [("WARNING", "retry", 1), ("WARNING", "retry", 2), ("ERROR", "failed", 3)],
        {"fail_c_until": 9},
    )
    job("tests.async_slow", [("ERROR", "timed_out", 1)], {"seconds": 1})
    task(tasks.add.enqueue(1, 2), COMPLETED)
    task(tasks.flaky.enqueue(succeed_on=2), RETRIED)
    task(tasks.boom.enqueue("kaput"), [("ERROR", "failed", 1)])
    task(tasks.too_slow.enqueue(), [("ERROR", "timed_out", 1)])
    task(tasks.add_async.enqueue(1, 2), COMPLETED)
    task(tasks.flaky_async.enqueue(succeed_on=2), RETRIED)
    task(tasks.flaky_async.enqueue(succeed_on=9), [("WARNING", "retry", 1), ("ERROR", "failed", 2)])

    def once_running() -> None:
        wait_until(lambda: Execution.objects.filter(run_id=stubborn.pk).exists(), timeout=60)
        assert cancel(stubborn.pk) == 1

    return said, once_running


Worker = Callable[..., tuple[str, str]]
COMMAND = [sys.executable, "-m", "django", "runjobworker", "--burst", "--noreload", "--skip-checks"]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    """Run ``runjobworker --burst`` on logs_settings to its end: its stdout and stderr.
    Killed at teardown if it is still running. The system checks' report is not
    what is read here (Django 6.1 on MariaDB warns of models.W044 at every command)."""
    started: list[subprocess.Popen[bytes]] = []

    def run(
        *args: str, meanwhile: Callable[[], None] = lambda: None, **env: str
    ) -> tuple[str, str]:
        out, err = tmp_path / f"stdout-{len(started)}", tmp_path / f"stderr-{len(started)}"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [*COMMAND, *args],
                cwd=ROOT,
                env=worker_env(DJANGO_SETTINGS_MODULE="tests.process.logs_settings", **env),
                stdout=stdout,
                stderr=stderr,
            )
            started.append(proc)
            meanwhile()
            code = proc.wait(timeout=120)
        text = out.read_text(errors="replace"), err.read_text(errors="replace")
        assert code == 0, text
        return text

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def assert_lines(found: list[Record], said: dict[int, Said], *, quiet: bool) -> None:
    """Each run's lines are those it must have, in order, a failure's traceback once;
    beside them, the worker's start and stop (none with ``-v 0``), nothing else."""
    expected = {
        run: [line for line in lines if not quiet or line[0] != "INFO"]
        for run, lines in said.items()
    }
    outcomes: dict[int, Said] = {run: [] for run in said}
    others = []
    for record in found:
        assert record.name.startswith("django_jobs."), record.line
        match = OUTCOME.search(record.line)
        if match is None or record.name != "django_jobs.execution":
            others.append(record.line)
            continue
        outcome = (record.level, match["outcome"], int(match["attempt"]))
        outcomes[int(match["run"])].append(outcome)
        if record.level == "INFO":
            assert record.more == [], record.line
            continue
        # The exception's own last line ends what follows, and a raised one's
        # traceback is there once; a timeout was never raised (no frames).
        error = re.search(r" error=(\S+) ", record.line)
        assert error is not None, record.line
        assert record.more[-1].startswith(error[1].removeprefix("builtins.") + ": "), record
        assert record.more.count(TRACEBACK) == (match["outcome"] != "timed_out"), record
    assert outcomes == expected
    # The worker's own lines, once each: the scheduler's start, the worker's start and stop.
    # A loaded machine may add the two warnings of a late heartbeat; nothing else.
    late_heartbeat = ("the control connection was busy for", "heartbeat thread silent for")
    others = [line for line in others if not any(text in line for text in late_heartbeat)]
    assert len(others) == (0 if quiet else 3), others
    text = "\n".join(line for record in found for line in [record.line, *record.more])
    raised = [
        line for lines in expected.values() for line in lines if line[1] in ("retry", "failed")
    ]
    assert text.count(TRACEBACK) == len(raised)
    assert "Task id=" not in text  # Django's own lines for these runs are not written


@pytest.mark.parametrize("debug", ["1", "0"], ids=["DEBUG", "not DEBUG"])
def test_each_run_is_logged_once_on_stderr(worker: Worker, debug: str) -> None:
    said, once_running = start_runs()
    stdout, stderr = worker(meanwhile=once_running, LOGS_DEBUG=debug)
    assert stdout == ""
    assert_lines(records(stderr, STAMPED), said, quiet=False)


def test_verbosity_0_writes_the_failed_attempts_alone(worker: Worker) -> None:
    said, once_running = start_runs()
    stdout, stderr = worker("-v", "0", meanwhile=once_running, LOGS_DEBUG="1")
    assert stdout == ""
    assert_lines(records(stderr, STAMPED), said, quiet=True)


def test_a_logging_of_the_project_own_writes_each_run_once(worker: Worker) -> None:
    """The project's LOGGING sends the root logger to stdout: django_jobs adds no
    handler; Django's console handler (DEBUG) writes none of its task lines."""
    said, once_running = start_runs()
    stdout, stderr = worker(meanwhile=once_running, LOGS_DEBUG="1", LOGS_ROOT="1")
    assert stderr == ""
    assert_lines(records(stdout, PLAIN), said, quiet=False)


def test_lines_of_other_loggers_keep_their_place(worker: Worker) -> None:
    """Lines of the run's logger, kept by the worker's handler, are written before a
    line of a logger of the project's own that follows them (Python's last resort
    writes it at once), and the next ones after it."""
    lines = [["run", "first"], ["run", "second"], ["elsewhere", "third"], ["run", "fourth"]]
    run = start("tests.says", {"lines": lines})
    stdout, stderr = worker(LOGS_DEBUG="1")
    assert stdout == ""
    texts = ("first", "second", "third", "fourth")
    said = [STAMP.sub("", line) for line in stderr.splitlines() if line.endswith(texts)]
    ours = f"INFO django_jobs.job run={run.pk} type=tests.says"
    assert said == [f"{ours} first", f"{ours} second", "third", f"{ours} fourth"], stderr
