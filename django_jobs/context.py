"""JobContext: what a handler sees of its run, and the durable operations on it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from . import api, conf, tracing, transitions
from .acontext import AsyncForms
from .attempt import Attempt
from .errors import error_record
from .exceptions import (
    InvalidJobInput,
    InvalidStepOutput,
    JobCanceled,
)
from .handling import (
    CHILD_ERRORS,
    NO_DEFAULT,
    PROGRESS_INTERVAL,
    RunLogger,
    event_outcome,
    progress_record,
    run_ids,
    until_of,
    wake_at,
)
from .handling import LeaseLost as LeaseLost
from .handling import Suspended as Suspended
from .models import FINISHED_STATUSES, ClosePolicy, JobRun
from .names import event_name
from .payloads import to_json
from .signals import event_consumed, step_completed
from .storage import leases, steps
from .storage.claiming import Claim

logger = logging.getLogger("django_jobs.job")


class JobContext(AsyncForms):
    """The handler's view of one attempt of one run, passed as its only argument.

    ``ctx.input`` is the run's input and ``ctx.attempt`` the attempt's number
    (1 for the first). Work that must not be repeated on a later attempt goes in
    ``ctx.step()``; ``ctx.spawn_child()``, ``ctx.wait_for()`` and ``ctx.sleep()``
    start children and wait without holding a worker slot; long loops call
    ``ctx.check_cancel()`` and may report ``ctx.set_progress()``. An ``async def``
    handler awaits the async forms instead: ``astep``, ``aspawn_child``,
    ``await_for``, ``asleep``, ``aset_progress``.
    """

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        self._claim = attempt.claim
        self.input: Any = attempt.claim.input
        self.attempt: int = attempt.claim.attempt
        self._occurrences: dict[str, int] = {}
        self._seq = 0
        self._steps: dict[str, dict[str, Any]] | None = None
        self._progress_written: tuple[float, dict[str, Any]] | None = None
        self._progress_pending: dict[str, Any] | None = None

    @cached_property
    def logger(self) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """A logger whose lines name the run and its job type."""
        return RunLogger(logger, {"run_id": self.run_id, "job_type": self.job_type})

    @property
    def run_id(self) -> int:
        return self._claim.run_id

    @property
    def job_type(self) -> str:
        return self._claim.job_type

    @cached_property
    def run(self) -> JobRun:
        """The run as claimed (built from the claimed row, without a query)."""
        return self._claim.as_run()

    def __repr__(self) -> str:
        return f"<JobContext run={self.run_id} type={self.job_type} attempt={self.attempt}>"

    # --- cancellation -------------------------------------------------------------

    @property
    def cancel_requested(self) -> bool:
        """True once the run was asked to cancel (or timed out, or was taken away)."""
        return self._attempt.cancel_noticed

    def check_cancel(self) -> None:
        """Raise ``JobCanceled`` if the run was asked to cancel; call it in long loops."""
        if self._attempt.cancel_noticed:
            raise JobCanceled(f"run {self.run_id} was asked to cancel")

    # --- progress -----------------------------------------------------------------

    def set_progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Record how far the run has got, for the admin and ``jobstatus``.

        Written at once the first time, when ``done`` reaches ``total`` and when
        the message changes; otherwise at most once per second, so a handler may
        call it on every item of a long loop. A value held back is written by a
        later call, after the next step, before a sleep or wait, and when the
        handler returns. An attempt that ends without ending the run (a retry,
        a rescue, a release at shutdown) clears the run's progress.
        """
        self._sync_only("set_progress")
        due = self._progress_due(done, total, message)
        if due is not None:
            self._write_progress(*due)

    async def aset_progress(
        self, done: float, total: float | None = None, message: str = ""
    ) -> None:
        """``set_progress`` for an ``async def`` handler."""
        due = self._progress_due(done, total, message)
        if due is not None:
            await self._attempt.run_sync(self._write_progress, *due)

    def _progress_due(
        self, done: Any, total: Any, message: Any
    ) -> tuple[dict[str, Any], float] | None:
        """The progress to write now, or None when the throttle holds it back."""
        progress = progress_record(done, total, message)
        now = time.monotonic()
        last = self._progress_written
        if last is not None and not (
            now - last[0] >= PROGRESS_INTERVAL
            or last[1]["message"] != progress["message"]
            or (total is not None and done >= total)
        ):
            self._progress_pending = progress
            return None
        return progress, now

    def flush_progress(self) -> None:
        """Write the progress value the throttle held back, if any."""
        if self._progress_pending is not None:
            self._write_progress(self._progress_pending, time.monotonic())

    async def aflush_progress(self) -> None:
        """``flush_progress`` for an async handler (no thread is asked when nothing waits)."""
        if self._progress_pending is not None:
            await self._attempt.run_sync(self.flush_progress)

    def _write_progress(self, progress: dict[str, Any], now: float) -> None:
        self._progress_pending = None
        progress["at"] = timezone.now()
        if not leases.write_progress(self._claim, progress):
            raise LeaseLost(f"run {self.run_id} is no longer held by this worker")
        self._progress_written = (now, progress)

    # --- steps --------------------------------------------------------------------

    def step(self, step_id: str, fn: Callable[[], Any], *, atomic: bool = False) -> Any:
        """Run ``fn`` once for this run and remember its JSON output.

        On later attempts the recorded output is returned without calling
        ``fn``. The same ``step_id`` used again in one execution is numbered
        (``send``, ``send#2``, ...). ``atomic=True`` runs ``fn`` and records its
        output in one transaction: exactly once for writes to the jobs database.
        """
        self._sync_only("step")
        key, seq = self._next(step_id)
        recorded = self._recorded(key)
        if recorded is not None:
            return recorded["output"]
        self.check_cancel()
        output = self._run_step(key, seq, fn, atomic)
        self.flush_progress()
        self._step_completed(key, output)
        self.check_cancel()
        return output

    def idempotency_key(self, step_id: str) -> str:
        """A key stable across attempts, to hand to external APIs for this step.

        Called inside the step's function, it names that occurrence of the step
        (``send#2`` in the second pass of a loop), so each occurrence gets its own key.
        """
        count = self._occurrences.get(step_id, 0)
        key = step_id if count <= 1 else f"{step_id}#{count}"
        return f"django_jobs:{self.run_id}:{key}"

    def _next(self, step_id: str) -> tuple[str, int]:
        if not isinstance(step_id, str) or not step_id or "#" in step_id:
            raise ValueError(f"step id must be a non-empty string without '#', got {step_id!r}")
        count = self._occurrences[step_id] = self._occurrences.get(step_id, 0) + 1
        self._seq += 1
        return (step_id if count == 1 else f"{step_id}#{count}"), self._seq

    def _recorded(self, key: str) -> dict[str, Any] | None:
        if self._steps is None:
            # The claim says whether the run has recorded steps at all; a first
            # execution then skips the query.
            fresh = self._claim.has_steps is False
            self._steps = {} if fresh else steps.load(self.run_id)
        row = self._steps.get(key)
        return row if row is not None and row["status"] == "completed" else None

    def _run_step(self, key: str, seq: int, fn: Callable[[], Any], atomic: bool) -> Any:
        started = timezone.now()
        try:
            if atomic:
                with transaction.atomic(using=conf.get().DATABASE):
                    output, text = self._validated(key, fn())
                    self._record(key, seq, output_json=text, started_at=started)
            else:
                output, text = self._validated(key, fn())
        except (Suspended, LeaseLost):
            raise
        except BaseException as exc:
            self._record_failure(key, seq, exc, started)
            raise
        if not atomic:
            self._record(key, seq, output_json=text, started_at=started)
        self._remember(key, output)
        return output

    def _record_failure(self, key: str, seq: int, exc: BaseException, started: datetime) -> None:
        """Record that the step raised ``exc``, as the run's own error will be, should it
        be this one; a database error here is logged (the step's exception matters)."""
        handler = self._attempt.handler
        retryable = handler is not None and handler.retryable(exc)
        error = error_record(exc, self.attempt, retryable=retryable)
        try:
            steps.record(self._claim, key, seq, error=error, started_at=started)
        except DatabaseError as db_error:
            self.logger.warning("step=%s failure not recorded: %s", key, db_error)

    def _validated(self, key: str, value: Any) -> tuple[Any, str]:
        """The step's output as it will be stored, and its JSON text."""
        try:
            text = to_json(value, what=f"the output of step {key!r}")
        except InvalidJobInput as exc:
            raise InvalidStepOutput(str(exc)) from None
        return json.loads(text), text

    def _record(self, key: str, seq: int, **fields: Any) -> None:
        if not steps.record(self._claim, key, seq, **fields):
            raise LeaseLost(f"run {self.run_id} is no longer held by this worker")

    # --- children -----------------------------------------------------------------

    def spawn_child(
        self,
        job_type: str,
        input: Any = None,
        *,
        close_policy: str = ClosePolicy.TERMINATE,
        run_at: datetime | None = None,
        priority: int | None = None,
        tags: Sequence[str] = (),
        pool: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> JobRun:
        """Start a child run, once: a replay returns the same child, never a second one."""
        self._sync_only("spawn_child")
        create = self._child_maker(
            job_type,
            input,
            close_policy=close_policy,
            run_at=run_at,
            priority=priority,
            tags=tags,
            pool=pool,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
        )
        recorded = self.step(f"spawn:{job_type}", create, atomic=True)
        return self._child(recorded["run_id"])

    def _child_maker(
        self, job_type: str, input: Any, *, close_policy: str, **options: Any
    ) -> Callable[[], dict[str, int]]:
        """The step function that starts the child (in the step's transaction)."""
        if close_policy not in ClosePolicy.values:
            raise ValueError(
                f"close_policy must be one of {ClosePolicy.values}, got {close_policy!r}"
            )

        # Here, where the attempt's span is current: the step may run on another thread.
        trace_context = tracing.capture()

        def create() -> dict[str, int]:
            child = api.start_child(
                self.run,
                job_type,
                input,
                close_policy=close_policy,
                trace_context=trace_context,
                **options,
            )
            return {"run_id": child.pk}

        return create

    def _child(self, run_id: int) -> JobRun:
        return JobRun.objects.using(conf.get().DATABASE).get(pk=run_id)

    def wait_for(self, runs: Iterable[JobRun | int]) -> list[Any]:
        """Return the outputs of ``runs`` (children of this run) once all have ended.

        Until then the run waits without a worker slot or its concurrency key,
        and is run again (earlier steps replayed) when the last one ends. A
        child that failed, timed out or was canceled raises ``ChildRunFailed``,
        ``ChildRunTimedOut`` or ``ChildRunCanceled``.
        """
        self._sync_only("wait_for")
        ids = run_ids(runs)
        rows = self._child_rows(ids)
        if self._unfinished(rows):
            self._record_wait(transitions.suspend_for, ids)
            raise Suspended(f"run {self.run_id} waits for {len(ids)} runs")
        return self._outputs(ids, rows)

    def _child_rows(self, ids: list[int]) -> dict[int, dict[str, Any]]:
        """The rows of ``ids``; raises unless every one is a child of this run."""
        rows: dict[int, dict[str, Any]] = {
            row["id"]: dict(row)
            for row in JobRun.objects.using(conf.get().DATABASE)
            .filter(pk__in=ids)
            .values("id", "status", "output", "error", "parent_id")
        }
        strangers = [i for i in ids if i not in rows or rows[i]["parent_id"] != self.run_id]
        if strangers:
            raise ValueError(f"wait_for() takes children of run {self.run_id}; not: {strangers}")
        return rows

    @staticmethod
    def _unfinished(rows: dict[int, dict[str, Any]]) -> bool:
        return any(row["status"] not in FINISHED_STATUSES for row in rows.values())

    @staticmethod
    def _outputs(ids: list[int], rows: dict[int, dict[str, Any]]) -> list[Any]:
        """The children's outputs, in the order asked; a child that did not complete raises."""
        for run_id in ids:
            row = rows[run_id]
            if row["status"] in CHILD_ERRORS:
                message = f"child run {run_id} ended {row['status']}"
                raise CHILD_ERRORS[row["status"]](message, run_id, row["error"])
        return [rows[run_id]["output"] for run_id in ids]

    # --- durable sleep ------------------------------------------------------------

    def sleep(self, step_id: str, duration: float | timedelta) -> None:
        """Wait ``duration`` without holding a worker slot; resume with steps replayed."""
        self._sync_only("sleep")
        seconds = conf.to_seconds(duration)
        wake = self.step(f"sleep:{step_id}", lambda: wake_at(seconds))
        until = until_of(wake)
        if until <= timezone.now():
            return
        self._record_wait(transitions.suspend_until, until)
        raise Suspended(f"run {self.run_id} sleeps until {until.isoformat()}")

    def _record_wait(self, suspend: Callable[[Claim, Any], str], arg: Any) -> None:
        """Record that the run waits; raise if it cannot (canceled, lost, in a transaction)."""
        self._before_wait()
        self._after_suspend(suspend(self._claim, arg))

    def _before_wait(self) -> None:
        """Raise unless the run may suspend now: asked to cancel, inside a transaction
        (unwinding would roll the suspension back and leave the run running), or
        ended by its worker (a timeout, an ignored cancel: the worker records it)."""
        self.check_cancel()
        connection = connections[conf.get().DATABASE]
        if len(connection.atomic_blocks) > self._attempt.atomic_depth:
            raise RuntimeError(
                f"run {self.run_id}: ctx.sleep(), ctx.wait_for() and ctx.wait_for_event() "
                "cannot be called inside transaction.atomic(); call them outside it"
            )
        self.flush_progress()
        if not self._attempt.own_outcome():
            raise LeaseLost(f"run {self.run_id} was ended by its worker")

    def _after_suspend(self, outcome: str) -> None:
        if outcome == transitions.CANCEL_REQUESTED:
            self._attempt.notice_cancel()
            self.check_cancel()
        if outcome == transitions.LOST:
            raise LeaseLost(f"run {self.run_id} is no longer held by this worker")

    # --- events -------------------------------------------------------------------

    def wait_for_event(
        self, name: str, *, timeout: float | timedelta | None = None, default: Any = NO_DEFAULT
    ) -> Any:
        """Return the payload of the next event ``name`` sent to this run (``send_event``).

        Events sent before the wait are kept, in order, each taken by one wait;
        until one comes the run waits without a worker slot or its concurrency key,
        and is run again (earlier steps replayed) when it does. The event taken is
        recorded like a step: a retry or a replay returns the same payload here.
        After ``timeout`` (seconds or a ``timedelta``, counted from the first time
        this wait ran) it returns ``default``, or raises ``EventTimeout`` without one.
        """
        self._sync_only("wait_for_event")
        key, seq, seconds = self._event_wait(name, timeout)
        until = None
        if seconds is not None:
            until = until_of(self.step(f"event-deadline:{name}", lambda: wake_at(seconds)))
        recorded = self._recorded(key)
        output = recorded["output"] if recorded else self._take_event(name, key, seq, until)
        return event_outcome(name, output, default)

    def _event_wait(self, name: str, timeout: Any) -> tuple[str, int, Any]:
        """The wait's step key and position, and its timeout in seconds (None without)."""
        name = event_name(name)
        key, seq = self._next(f"event:{name}")
        return key, seq, None if timeout is None else conf.to_seconds(timeout)

    def _take_event(self, name: str, key: str, seq: int, until: datetime | None) -> Any:
        self._before_wait()
        outcome, output = transitions.take_event(self._claim, name, key, seq, until)
        if outcome in (transitions.EVENT_TAKEN, transitions.EVENT_TIMED_OUT):
            # Not suspended: the attempt goes on, under its timeout and cancel grace.
            self._attempt.yield_outcome()
            self._remember(key, output)
            if outcome == transitions.EVENT_TAKEN and event_consumed.receivers:
                event_consumed.send_robust(
                    JobRun,
                    run_id=self.run_id,
                    job_type=self.job_type,
                    name=name,
                    event_id=output["event"],
                    step_id=key,
                )
            return output
        self._after_suspend(outcome)
        raise Suspended(f"run {self.run_id} waits for the event {name!r}")

    def _remember(self, key: str, output: Any) -> None:
        """Keep a step's recorded output for the rest of this execution."""
        assert self._steps is not None
        self._steps[key] = {"step_id": key, "status": "completed", "output": output}

    def _load_steps(self) -> None:
        self._steps = steps.load(self.run_id)

    def _step_completed(self, key: str, output: Any) -> None:
        step_completed.send_robust(
            JobRun, run_id=self.run_id, job_type=self.job_type, step_id=key, output=output
        )

    def _sync_only(self, name: str) -> None:
        """Refuse a sync durable operation in an ``async def`` handler, naming its async form
        (it would block the event loop, and Django refuses database work there)."""
        if self._attempt.is_async:
            forms = {"wait_for": "await_for", "wait_for_event": "await_event"}
            form = forms.get(name, f"a{name}")
            raise TypeError(
                f"ctx.{name}() is for def handlers; in an async def handler, await ctx.{form}(...)"
            )
