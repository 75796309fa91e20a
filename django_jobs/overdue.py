"""Attempts in flight that must end: asked to cancel, past their timeout, or past the
grace a cancel gives them. The worker's watchdog calls these every tick (and the
cancel poll every heartbeat) with a snapshot of its attempts.

A run past its timeout is fenced off first, then told to stop, so that the
handler's ``JobCanceled`` finds the outcome taken and the timeout is what is
written. An async handler's task is canceled; a thread cannot be stopped, so its
handler runs on, its late writes fenced off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from .attempt import Attempt
from .execution import canceled, log_outcome, record, timed_out
from .storage import leases


def notice_cancel_requests(attempts: Iterable[Attempt]) -> None:
    """Tell handlers whose run was asked to cancel, or was taken away, to stop."""
    running: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        if not attempt.cancel_noticed:
            running.setdefault(attempt.run_id, []).append(attempt)
    for run_id in leases.cancel_requested(list(running)):
        for attempt in running[run_id]:
            attempt.notice_cancel()


def end_overdue(attempts: Iterable[Attempt], cancel_grace: float, stop: threading.Event) -> None:
    """End the runs past their timeout, and the canceled runs whose handler ignored the
    cancel for longer than ``cancel_grace`` seconds."""
    now = time.monotonic()
    for attempt in attempts:
        claim = attempt.claim
        if attempt.deadline is not None and now > attempt.deadline and attempt.fence_off():
            attempt.notice_cancel()
            assert attempt.handler is not None  # only a handler gives a deadline
            decision = timed_out(attempt.handler, claim)
            outcome = record(claim, decision, stop)
            log_outcome(claim, outcome, now - attempt.started, decision)
            attempt.stop_task()
        elif (
            attempt.cancel_noticed_at is not None
            and now > attempt.cancel_noticed_at + cancel_grace
            and attempt.fence_off()
        ):
            message = f"the handler ignored the cancel request for {cancel_grace:g}s"
            outcome = record(claim, canceled(claim, message), stop)
            log_outcome(claim, outcome, now - attempt.started)
            attempt.stop_task()
