"""``runjobworker --reload`` on a project of its own in a temporary directory: a code
change restarts the worker after its running run; signals stop parent and child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from django_jobs.models import JobRun, Status, Worker, WorkerStatus
from tests.factories import JobRunFactory
from tests.helpers import ROOT, WorkerProcess, wait_until, worker_env
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

StartWorker = Callable[..., WorkerProcess]
CHANGED = "jobs.py changed; finishing the running runs before the restart"

SETTINGS = """
import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "reloadapp"]  # noqa: F405
DEBUG = os.environ.get("RELOAD_DEBUG") == "1"
"""

JOBS = """
import os
import time

from django_jobs import job
from tests.testapp.models import Execution

VERSION = 1


@job("reloadapp.nap", pool="reload")
def nap(ctx):
    Execution.objects.create(
        run_id=ctx.run_id, job_type="reloadapp.nap", attempt=ctx.attempt, pid=os.getpid()
    )
    time.sleep(ctx.input["seconds"])
    return {"version": VERSION, "pid": os.getpid()}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A settings module and an installed app ``reloadapp`` of their own, to edit."""
    (tmp_path / "reload_settings.py").write_text(SETTINGS)
    app = tmp_path / "reloadapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "jobs.py").write_text(textwrap.dedent(JOBS))
    return tmp_path


def env(project: Path, **more: str) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "reload_settings",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{project}",
        # A same-size edit within a second must not be taken for the cached bytecode.
        "PYTHONDONTWRITEBYTECODE": "1",
        **more,
    }


def edit(path: Path, old: str, new: str, worker: WorkerProcess, seen: str) -> None:
    """Change ``path``, then move its mtime on by whole seconds until ``worker`` logs
    ``seen``: a reloader compares mtimes with those it saw first, and a change made
    before its first look (while it starts) is no change to it."""
    path.write_text(path.read_text().replace(old, new))
    mtime = path.stat().st_mtime

    def noticed() -> bool:
        nonlocal mtime
        if seen in worker.output():
            return True
        mtime += 2
        os.utime(path, (mtime, mtime))
        return False

    wait_until(noticed, timeout=60, interval=1.0)


def nap(seconds: float) -> JobRun:
    """A run of reloadapp.nap (a type this process does not know, so not through start())."""
    run: JobRun = JobRunFactory(job_type="reloadapp.nap", pool="reload", input={"seconds": seconds})
    return run


def live_worker(*, exclude: tuple[str, ...] = ()) -> Worker | None:
    return (
        Worker.objects.filter(status=WorkerStatus.RUNNING)
        .exclude(pk__in=exclude)
        .order_by("-started_at")
        .first()
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is no zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def refreshed(run: JobRun) -> JobRun:
    run.refresh_from_db()
    return run


def test_a_code_change_restarts_the_worker_once_its_running_run_is_done(
    project: Path, start_worker: StartWorker
) -> None:
    worker = start_worker("--pool", "reload", "--reload", **env(project))
    wait_until(lambda: live_worker() is not None, timeout=60)
    first = live_worker()
    assert first is not None
    assert first.pid != worker.pid  # the reloader's own process runs no worker
    assert Worker.objects.count() == 1

    run = nap(3)
    wait_until(lambda: Execution.objects.filter(run_id=run.pk).exists(), timeout=30)
    edit(project / "reloadapp" / "jobs.py", "VERSION = 1", "VERSION = 2", worker, CHANGED)

    wait_until(lambda: live_worker(exclude=(first.pk,)) is not None, timeout=60)
    second = live_worker(exclude=(first.pk,))
    assert second is not None
    # The run started before the change finished on the first worker: not released,
    # not rescued, run once.
    run = refreshed(run)
    assert (run.status, run.attempts, run.output) == (
        Status.COMPLETED,
        1,
        {"version": 1, "pid": first.pid},
    )
    assert Execution.objects.filter(run_id=run.pk).count() == 1
    first.refresh_from_db()
    assert first.status == WorkerStatus.STOPPED
    assert second.pid not in (first.pid, worker.pid)
    assert not alive(first.pid)

    # The new worker runs the new code.
    again = nap(0)
    wait_until(lambda: refreshed(again).status == Status.COMPLETED, timeout=30)
    assert again.output == {"version": 2, "pid": second.pid}

    # SIGTERM to the reloader drains the worker's running run, then both exit.
    last = nap(2)
    wait_until(lambda: Execution.objects.filter(run_id=last.pk).exists(), timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert (refreshed(last).status, last.attempts) == (Status.COMPLETED, 1)
    assert set(Worker.objects.values_list("status", flat=True)) == {WorkerStatus.STOPPED}
    wait_until(lambda: not alive(second.pid), timeout=10)
    output = worker.output()
    assert output.count(CHANGED) == 1
    assert "reloader restarting the worker (code changed)" in output
    assert "Traceback" not in output


def test_a_broken_change_waits_for_the_fix(project: Path, start_worker: StartWorker) -> None:
    worker = start_worker("--pool", "reload", "--reload", **env(project))
    wait_until(lambda: live_worker() is not None, timeout=60)
    first = live_worker()
    assert first is not None
    jobs = project / "reloadapp" / "jobs.py"
    # A syntax error: the new worker cannot start, and the reloader waits for a fix.
    edit(jobs, "VERSION = 1", "VERSION = (", worker, CHANGED)
    wait_until(lambda: "it starts again when a file changes" in worker.output(), timeout=60)
    assert worker.proc.poll() is None
    assert live_worker() is None
    edit(jobs, "VERSION = (", "VERSION = 3", worker, "a file changed; starting the worker again")
    wait_until(lambda: live_worker() is not None, timeout=60)
    run = nap(0)
    wait_until(lambda: refreshed(run).status == Status.COMPLETED, timeout=30)
    assert run.output["version"] == 3
    worker.signal(signal.SIGINT)  # Ctrl-C
    assert worker.wait(timeout=60) == 0, worker.output()


def test_the_worker_stops_when_the_reloaders_process_is_killed(
    project: Path, start_worker: StartWorker
) -> None:
    worker = start_worker("--pool", "reload", "--reload", **env(project))
    wait_until(lambda: live_worker() is not None, timeout=60)
    child = live_worker()
    assert child is not None
    run = nap(2)
    wait_until(lambda: Execution.objects.filter(run_id=run.pk).exists(), timeout=30)
    worker.signal(signal.SIGKILL)
    worker.wait(timeout=10)
    # Orphaned, the child drains its run and stops instead of running on alone.
    wait_until(lambda: not alive(child.pid), timeout=60)
    child.refresh_from_db()
    assert child.status == WorkerStatus.STOPPED
    assert (refreshed(run).status, run.attempts) == (Status.COMPLETED, 1)


def test_debug_turns_the_reloader_on_unless_told_otherwise(
    project: Path, start_worker: StartWorker
) -> None:
    debug = env(project, RELOAD_DEBUG="1")
    on = start_worker("--pool", "reload", **debug)
    wait_until(lambda: live_worker() is not None, timeout=60)
    reloaded = live_worker()
    assert reloaded is not None
    assert reloaded.pid != on.pid
    on.signal(signal.SIGTERM)
    assert on.wait(timeout=60) == 0, on.output()

    off = start_worker("--pool", "reload", "--noreload", **debug)
    wait_until(lambda: live_worker() is not None, timeout=60)
    alone = live_worker()
    assert alone is not None
    assert alone.pid == off.pid
    off.signal(signal.SIGTERM)
    assert off.wait(timeout=60) == 0, off.output()

    # A worker that exits by itself is not reloaded, DEBUG or not.
    burst = start_worker("--pool", "reload", "--burst", **debug)
    assert burst.wait(timeout=60) == 0, burst.output()
    assert Worker.objects.filter(pid=burst.pid).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reload", "--burst"], "--reload cannot be combined with --burst or --max-runs"),
        (["--reload", "--max-runs", "3"], "--reload cannot be combined with --burst"),
        (["--reload", "--noreload"], "argument --noreload: not allowed with argument --reload"),
    ],
)
def test_flags_that_cannot_go_together_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobworker", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert not Worker.objects.exists()
