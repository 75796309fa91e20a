"""The async forms of a handler's durable operations, for ``async def`` handlers.

The same records and rules as the sync names on ``JobContext``: what touches the
database runs through the attempt's ``run_sync`` (on a worker, one of its database
threads; under ``drain()``, the caller's thread), the handler's own code on the
event loop. ``AsyncForms`` is a base of ``context.JobContext``, not used alone.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from . import conf, transitions
from .handling import (
    NO_DEFAULT,
    LeaseLost,
    Suspended,
    blocking,
    event_outcome,
    run_ids,
    until_of,
    wake_at,
)
from .models import ClosePolicy, JobRun
from .signals import step_completed

if TYPE_CHECKING:
    from .attempt import Attempt
    from .storage.claiming import Claim


class AsyncForms:
    """``astep``, ``aspawn_child``, ``await_for``, ``asleep`` and ``await_event``."""

    _attempt: Attempt
    _claim: Claim
    _steps: dict[str, dict[str, Any]] | None

    if TYPE_CHECKING:  # JobContext's

        @property
        def run_id(self) -> int: ...
        def check_cancel(self) -> None: ...
        async def aflush_progress(self) -> None: ...
        def _next(self, step_id: str) -> tuple[str, int]: ...
        def _recorded(self, key: str) -> dict[str, Any] | None: ...
        def _load_steps(self) -> None: ...
        def _run_step(self, key: str, seq: int, fn: Callable[[], Any], atomic: bool) -> Any: ...
        def _record_failure(
            self, key: str, seq: int, exc: BaseException, started: datetime
        ) -> None: ...
        def _validated(self, key: str, value: Any) -> tuple[Any, str]: ...
        def _record(self, key: str, seq: int, **fields: Any) -> None: ...
        def _remember(self, key: str, output: Any) -> None: ...
        def _step_completed(self, key: str, output: Any) -> None: ...
        def _child_maker(
            self, job_type: str, input: Any, *, close_policy: str, **options: Any
        ) -> Callable[[], dict[str, int]]: ...
        def _child(self, run_id: int) -> JobRun: ...
        def _child_rows(self, ids: list[int]) -> dict[int, dict[str, Any]]: ...
        @staticmethod
        def _unfinished(rows: dict[int, dict[str, Any]]) -> bool: ...
        @staticmethod
        def _outputs(ids: list[int], rows: dict[int, dict[str, Any]]) -> list[Any]: ...
        def _record_wait(self, suspend: Callable[[Claim, Any], str], arg: Any) -> None: ...
        def _event_wait(self, name: str, timeout: Any) -> tuple[str, int, Any]: ...
        def _take_event(self, name: str, key: str, seq: int, until: datetime | None) -> Any: ...

    async def astep(self, step_id: str, fn: Callable[[], Any], *, atomic: bool = False) -> Any:
        """``step`` for an ``async def`` handler: ``fn`` is an async function, or a
        function (its result awaited when it returns an awaitable).

        A plain function runs where Django runs sync code for async code
        (``sync_to_async``), so it may use the ORM. ``atomic=True`` runs ``fn`` and
        records its output in one transaction on one of the worker's database
        threads, which it holds until ``fn`` returns; an async ``fn``'s ORM calls
        join that transaction.
        """
        key, seq = self._next(step_id)
        run_sync = self._attempt.run_sync
        if self._steps is None and self._claim.has_steps is not False:
            await run_sync(self._load_steps)
        recorded = self._recorded(key)
        if recorded is not None:
            return recorded["output"]
        self.check_cancel()
        if atomic:
            output = await run_sync(self._run_step, key, seq, blocking(fn), True)
        else:
            output = await self._arun_step(key, seq, fn)
        await self.aflush_progress()
        if step_completed.receivers:
            await run_sync(self._step_completed, key, output)
        self.check_cancel()
        return output

    async def aspawn_child(
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
        """``spawn_child`` for an ``async def`` handler: started once, in a step."""
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
        recorded = await self.astep(f"spawn:{job_type}", create, atomic=True)
        child: JobRun = await self._attempt.run_sync(self._child, recorded["run_id"])
        return child

    async def await_for(self, runs: Iterable[JobRun | int]) -> list[Any]:
        """``wait_for`` for an ``async def`` handler: the children's outputs once all
        have ended; until then the run waits without a slot (the task ends here)."""
        ids = run_ids(runs)
        run_sync = self._attempt.run_sync
        rows = await run_sync(self._child_rows, ids)
        if self._unfinished(rows):
            await run_sync(self._record_wait, transitions.suspend_for, ids)
            raise Suspended(f"run {self.run_id} waits for {len(ids)} runs")
        return self._outputs(ids, rows)

    async def asleep(self, step_id: str, duration: float | timedelta) -> None:
        """``sleep`` for an ``async def`` handler: a durable sleep, not ``asyncio.sleep``;
        the run gives up its slot and is run again (steps replayed) when it is over."""
        seconds = conf.to_seconds(duration)

        async def wake() -> dict[str, datetime]:
            return wake_at(seconds)

        until = until_of(await self.astep(f"sleep:{step_id}", wake))
        if until <= timezone.now():
            return
        await self._attempt.run_sync(self._record_wait, transitions.suspend_until, until)
        raise Suspended(f"run {self.run_id} sleeps until {until.isoformat()}")

    async def await_event(
        self, name: str, *, timeout: float | timedelta | None = None, default: Any = NO_DEFAULT
    ) -> Any:
        """``wait_for_event`` for an ``async def`` handler: the same records and rules;
        while it waits, the run gives up its slot (the task ends here)."""
        key, seq, seconds = self._event_wait(name, timeout)
        until = None
        if seconds is not None:

            async def wake() -> dict[str, datetime]:
                return wake_at(seconds)

            until = until_of(await self.astep(f"event-deadline:{name}", wake))
        run_sync = self._attempt.run_sync
        if self._steps is None and self._claim.has_steps is not False:
            await run_sync(self._load_steps)
        recorded = self._recorded(key)
        if recorded:
            return event_outcome(name, recorded["output"], default)
        output = await run_sync(self._take_event, name, key, seq, until)
        return event_outcome(name, output, default)

    async def _arun_step(self, key: str, seq: int, fn: Callable[[], Any]) -> Any:
        run_sync = self._attempt.run_sync
        started = timezone.now()
        try:
            if inspect.iscoroutinefunction(fn):
                value = await fn()
            else:
                value = await sync_to_async(fn, thread_sensitive=True)()
            if inspect.isawaitable(value):
                value = await value
            output, text = self._validated(key, value)
        except (Suspended, LeaseLost, asyncio.CancelledError):
            raise
        except BaseException as exc:
            await run_sync(self._record_failure, key, seq, exc, started)
            raise
        await run_sync(self._record, key, seq, output_json=text, started_at=started)
        self._remember(key, output)
        return output
