"""``runjobworker --reload``: start the worker again when code changes, as ``runserver`` does.

Two processes, as Django's autoreloader makes them. The command as started is
the *parent*: it runs no worker, opens no database connection and registers no
``Worker`` row; it starts the same command line again as its *child*, and again
each time the child exits with ``RESTART`` (3, Django's convention). The child
runs the worker in its main thread, with the SIGTERM drain it has without
``--reload``, and Django's reloader (``autoreload.get_reloader()``, watchman or
polling) in a thread. On a change of a watched file (the modules imported, so
every installed app's code) it asks the worker to stop, lets its in-flight runs
finish, then exits 3.

Django's ``run_with_reloader`` is not used as is: it runs the main function in a
daemon thread that the process's exit kills (the runs would be left running,
to be rescued), installs a SIGTERM handler that exits at once, and its parent
kills the child when it is signalled. Here a signal to the parent is passed to
the child, once per signal received, so that a first SIGTERM or Ctrl-C drains
and a second one gives the runs back, as without ``--reload``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from django.utils import autoreload

from django_jobs.worker import JobWorker

logger = logging.getLogger(__name__)

RESTART = 3
# Set in the child's environment to the parent's pid: a process is the child only
# when its parent is that process (an inherited value means nothing to a grandchild).
PARENT_ENV = "DJANGO_JOBS_RELOADER_PARENT"
# Signals the parent passes on; a hang-up (the terminal closed) stops the child as SIGTERM.
FORWARDED = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT}
if hasattr(signal, "SIGHUP"):
    FORWARDED[signal.SIGHUP] = signal.SIGTERM
# How often the parent looks for a changed file while the child is down, and the
# child for its parent: a person's wait, not a machine's.
POLL = 1.0


def is_child() -> bool:
    """Whether this process is a reloader's child (its worker is the one to run)."""
    return os.environ.get(PARENT_ENV) == str(os.getppid())


def exit_status(returncode: int) -> int:
    """A child's ``Popen.returncode`` as a shell reports it (killed by signal N: 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


class Supervisor:
    """The parent: start the child, start it again when it asks, pass signals on."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.stop = threading.Event()  # a signal came: no more restarts

    def run(self) -> int:
        """Start children until one ends for another reason than a code change;
        return the exit status for the command."""
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        started = 0
        while True:
            returncode = self._run_child()
            started += 1
            if self.stop.is_set() or returncode == 0:
                return exit_status(returncode)
            if returncode == RESTART:
                logger.info("reloader restarting the worker (code changed)")
                continue
            if started == 1:
                # The first start failed (settings, database, migrations): say so
                # and stop, rather than wait for a change the problem may not need.
                return exit_status(returncode)
            logger.error(
                "reloader: the worker exited with status %d; it starts again when a "
                "file changes (Ctrl-C to stop)",
                exit_status(returncode),
            )
            if not self._changed():
                return exit_status(returncode)
            logger.info("reloader: a file changed; starting the worker again")

    def _run_child(self) -> int:
        env = {
            **os.environ,
            autoreload.DJANGO_AUTORELOAD_ENV: "true",  # RUN_MAIN, as runserver's child
            PARENT_ENV: str(os.getpid()),
        }
        # A process group of its own: a terminal's Ctrl-C reaches the parent only,
        # which passes it on once (reaching both, it would count as two).
        group: dict[str, Any] = {"process_group": 0} if os.name == "posix" else {}
        self.child = subprocess.Popen(
            autoreload.get_child_arguments(), env=env, close_fds=False, **group
        )
        if self.stop.is_set():  # a signal came while the child was being started
            self.child.send_signal(signal.SIGTERM)
        try:
            return self.child.wait()
        finally:
            self.child = None

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(FORWARDED[signal.Signals(signum)])

    def _changed(self) -> bool:
        """Wait until a file this process imported changes (True) or a signal comes."""
        reloader = autoreload.StatReloader()
        seen: dict[Path, float] = dict(reloader.snapshot_files())
        while not self.stop.wait(POLL):
            for path, mtime in reloader.snapshot_files():
                if seen.get(path) != mtime:
                    return True
        return False


class Reloading:
    """The child's side: stop ``worker`` when code changes or a signal comes, and
    tell ``handle`` whether to exit with ``RESTART``."""

    def __init__(self, worker: JobWorker) -> None:
        self.worker = worker
        self.restart = False  # a change was seen: exit 3 once drained
        self.stopping_for_good = False  # a signal, or the parent is gone: exit, no restart
        self._lock = threading.Lock()
        self._parent = os.getppid()

    def start(self) -> None:
        """Watch files with Django's reloader, and the parent, each in a daemon thread."""
        autoreload.file_changed.connect(self._file_changed, dispatch_uid=id(self))
        reloader = autoreload.get_reloader()
        main = threading.main_thread()
        logger.info("reloader watching for file changes with %s", type(reloader).__name__)
        threading.Thread(
            target=reloader.run, args=(main,), name="django-jobs-reloader", daemon=True
        ).start()
        threading.Thread(
            target=self._watch_parent, name="django-jobs-reloader-parent", daemon=True
        ).start()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT as without ``--reload`` (drain, then give runs back),
        except that the first one during a restart's drain only cancels the restart."""

        def handle(signum: int, frame: FrameType | None) -> None:
            logger.info("worker=%s got %s", self.worker.worker_id, signal.Signals(signum).name)
            with self._lock:
                if self.restart and not self.stopping_for_good:
                    # Already draining for a restart: stop after it instead.
                    self.restart, self.stopping_for_good = False, True
                    return
                self.stopping_for_good = True
            self.worker.request_stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _file_changed(self, sender: Any, file_path: Path, **kwargs: Any) -> bool:
        """Django's reloader saw ``file_path`` change: drain, then restart. Returns
        True, so that the reloader does not end the process itself (mid-run)."""
        with self._lock:
            if self.restart or self.stopping_for_good:
                return True  # one drain; a second request would give the runs back
            self.restart = True
        logger.info(
            "worker=%s %s changed; finishing the running runs before the restart",
            self.worker.worker_id,
            file_path,
        )
        self.worker.request_stop()
        return True

    def _watch_parent(self) -> None:
        """Stop the worker (a drain, no restart) if the parent dies, e.g. SIGKILLed:
        no child is left running on its own."""
        while os.getppid() == self._parent:
            if self.worker.hard_stop.wait(POLL):
                return
        logger.warning("worker=%s the reloader's process is gone; stopping", self.worker.worker_id)
        with self._lock:
            if self.stopping_for_good:
                return
            self.restart, self.stopping_for_good = False, True
        if not self.worker.stopping.is_set():  # a second request would give the runs back
            self.worker.request_stop()
