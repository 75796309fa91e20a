"""A backend for Django's tasks framework: ``@task`` functions run as django_jobs runs.

    TASKS = {"default": {"BACKEND": "django_jobs.tasks_backend.JobsBackend"}}

``enqueue()`` inserts a ``JobRun`` in the caller's transaction (``api.start_handler``):
its job type is the task's module path, its pool the task's queue name, its
input ``{"args": [...], "kwargs": {...}}``, and its trigger ``("task", alias)``.
A worker serving that pool finds the task by its module path (``resolve_task``)
and runs it like any job: attempts, leases, rescue, timeouts, cancellation.

A result's id is its run's id signed with ``SECRET_KEY`` (``"42:…"``): short and
stored nowhere, yet a caller holding one result cannot read another's by counting.
``run_id()`` turns a result id back into the run's id.

Django imports this module when it runs the tasks backends' system checks, and
a project may name the backend before it installs the app: the models (and the
API, which needs them) are imported inside the functions that use them, so that
such a project gets check ``django_jobs.E006`` rather than a traceback, and its
``enqueue()`` an ``ImproperlyConfigured``.
"""

from __future__ import annotations

import fnmatch
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signing import BadSignature, Signer
from django.utils.module_loading import autodiscover_modules, import_string

from . import conf, joboptions
from .backoff import NO_RETRY, RetryPolicy
from .exceptions import InvalidJobInput, never_retried
from .logstream import SafeTracebacks, outcome_line_to_follow
from .names import concurrency_limit, pool_problem
from .payloads import normalize
from .registry import JobHandler, get_handler, with_options
from .schedules import Target, idempotency_key
from .task_lookup import loaded_tasks, task_at
from .tasks_compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

logger = logging.getLogger(__name__)


class OutcomesLoggedOnce(logging.Filter):
    """Drop the lines Django's tasks framework logs for this backend's runs that
    django_jobs logs itself: each attempt's start (``task_started``; the worker
    logs no start at INFO), and an end whose outcome line follows (``task_finished``
    while a worker or ``drain()`` records the run's end). Ends django_jobs logs
    no line of its own for (a pending task canceled, a run of a dead worker
    failed by the rescue) keep Django's line. In the test mode (``RUN_ON_COMMIT``)
    every line is kept, as under Django's immediate backend, whose tests read them."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg != "Task id=%s path=%s state=%s" or not isinstance(args, tuple):
            return True
        if conf.get().RUN_ON_COMMIT:
            return True
        try:
            run = run_id(str(args[0]))
        except TaskResultDoesNotExist:
            return True  # another backend's task
        return args[-1] != TaskResultStatus.RUNNING and run != outcome_line_to_follow()


# Django's tasks framework logs each task's start and end (its own receivers of
# task_started and task_finished; Django 6's logger, the backport's): not twice
# for a run of this backend, and a failed task's exception message adds no line.
for _name in ("django.tasks", "django_tasks"):
    logging.getLogger(_name).addFilter(OutcomesLoggedOnce())
    logging.getLogger(_name).addFilter(SafeTracebacks())

# JobRun.trigger_source of the runs this backend enqueues; trigger_ref is the alias.
TASK_SOURCE = "task"
# Result ids are signed with this salt, so that no other signature of the
# project's (a session, a password reset) can pass for one.
RESULT_ID_SALT = "django_jobs.tasks_backend.result-id"
NOT_INSTALLED_HINT = 'Add "django_jobs" to INSTALLED_APPS and run migrate.'

# A run's status (models.Status, by value: the models are not imported here) as
# a task result's.
STATUSES = {
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "waiting": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "timed_out": TaskResultStatus.FAILED,
    "canceled": TaskResultStatus.FAILED,
}

TaskKey = str | Callable[..., str | None] | None
if TYPE_CHECKING:
    from .models import JobRun

    AnyTask = Task[..., Any]
    AnyResult = TaskResult[Any, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsTask(Task):  # type: ignore[type-arg,misc,unused-ignore]
    """A task with django_jobs' options, given to ``@task(...)`` (Django 6.1+, django-tasks).

    ``retry`` is a ``RetryPolicy``; ``timeout`` seconds or a ``timedelta``;
    ``concurrency_key`` a string, or a callable given the task's arguments;
    ``concurrency_limit`` how many runs of a key may run at once (1 to 1000).
    """

    retry: RetryPolicy | None = None
    timeout: float | timedelta | None = None
    concurrency_key: TaskKey = None
    concurrency_limit: int = 1


class JobsBackend(BaseTaskBackend):  # type: ignore[misc,unused-ignore]
    """Runs ``@task`` functions on django_jobs workers (``runjobworker --pool QUEUE``)."""

    task_class = JobsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: AnyTask) -> None:
        super().validate_task(task)
        problem = pool_problem(task.queue_name)
        if problem is not None:
            raise InvalidTask(f"queue_name {task.queue_name!r} {problem}.")
        if isinstance(task, JobsTask):
            _validate_options(task)

    def enqueue(self, task: AnyTask, args: Any, kwargs: Any) -> AnyResult:
        self._require_app()
        self.validate_task(task)
        data = normalize(normalize_json({"args": args, "kwargs": kwargs}), what="arguments")
        from .inline import deferred

        # In test mode (RUN_ON_COMMIT) the run runs after task_enqueued is sent,
        # as on Django's immediate backend; its result then says how it ended.
        with deferred():
            run = self._start(task, data, run_at=task.run_after)
            task_enqueued.send(type(self), task_result=self.result_of(run))
        return self.result_of(run)

    def start_scheduled(self, task: AnyTask, data: Any, name: str, tick: datetime) -> JobRun:
        """Start the run of schedule ``name`` for ``tick``: a run of ``task`` as
        ``enqueue()`` makes one, its input ``{"args": [...], "kwargs": {...}}``."""
        self._require_app()
        self.validate_task(task)
        data = scheduled_arguments(task, data)
        key = idempotency_key(name, tick)
        run = self._start(task, data, run_at=tick, idempotency_key=key, scheduled=True)
        task_enqueued.send(type(self), task_result=self.result_of(run))
        return run

    def _start(self, task: AnyTask, data: dict[str, Any], **options: Any) -> JobRun:
        from .api import start_handler

        handler = handler_for(task)
        # JOB_OPTIONS' key function (given the task's arguments) is the handler's;
        # else the task's own.
        keyed_by_settings = "concurrency_key" in joboptions.options_for(
            handler.job_type, arguments=True
        )
        return start_handler(
            handler,
            data,
            trigger=(TASK_SOURCE, self.alias),
            pool=handler.pool,
            priority=handler.priority,
            concurrency_key=None if keyed_by_settings else _key(task, data),
            concurrency_limit=handler.concurrency_limit,
            **options,
        )

    def get_result(self, result_id: str) -> AnyResult:
        self._require_app()
        from .models import JobRun

        run = (
            JobRun.objects.using(conf.get().DATABASE)
            .filter(pk=run_id(result_id), trigger_source=TASK_SOURCE, trigger_ref=self.alias)
            .first()
        )
        if run is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(run)

    def result_of(self, run: JobRun) -> AnyResult:
        """The ``TaskResult`` of a task's run, as stored now."""
        from .models import Status

        result = TaskResult(
            task=self._task_of(run),
            id=result_id(run.pk),
            status=STATUSES[run.status],
            enqueued_at=run.created_at,
            # One column holds the latest attempt's start, as in django-tasks-db.
            started_at=run.started_at,
            last_attempted_at=run.started_at,
            finished_at=run.finished_at,
            args=run.input.get("args", []),
            kwargs=run.input.get("kwargs", {}),
            backend=self.alias,
            errors=_errors(run),
            worker_ids=list(run.worker_ids),
        )
        if run.status == Status.COMPLETED:
            object.__setattr__(result, "_return_value", run.output)
        return result

    def _task_of(self, run: JobRun) -> AnyTask:
        # The row names the task: found as a worker finds it, never by importing
        # a module outside the installed apps.
        task = task_at(run.job_type, importing=True)
        if task is None:
            raise ImproperlyConfigured(
                f"run {run.pk} is a task run, but {run.job_type!r} is no longer a task"
            )
        changes: dict[str, Any] = {
            "priority": run.priority,
            "queue_name": run.pool,
            "backend": self.alias,
        }
        # run_at is created_at unless the task was deferred (or a retry was scheduled).
        if run.run_at != run.created_at:
            changes["run_after"] = run.run_at
        try:
            return task.using(**changes)
        except InvalidTask:
            # A pool or priority JOB_OPTIONS gave the run, which the tasks framework
            # refuses (a pool outside QUEUES, a priority outside -100..100): the
            # result names the task's own.
            del changes["priority"], changes["queue_name"]
            return task.using(**changes)

    def _require_app(self) -> None:
        """Raise ``ImproperlyConfigured`` unless django_jobs is installed (check E006)."""
        if not apps.is_installed("django_jobs"):
            raise ImproperlyConfigured(f"{self._not_installed()} {NOT_INSTALLED_HINT}")

    def _not_installed(self) -> str:
        backend = type(self).__name__
        return f"TASKS[{self.alias!r}] uses {backend}, but django_jobs is not installed."

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("django_jobs"):
            messages.append(
                checks.Error(self._not_installed(), hint=NOT_INSTALLED_HINT, id="django_jobs.E006")
            )
        for queue in sorted(self.queues):
            problem = pool_problem(queue)
            if problem is not None:
                messages.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}]['QUEUES'] has {queue!r}, which {problem}.",
                        hint="Queue names are django_jobs pools: 1 to 100 characters, "
                        "no whitespace or control characters.",
                        id="django_jobs.E007",
                    )
                )
        if self.options:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys: "
                    + ", ".join(sorted(map(str, self.options))),
                    hint="JobsBackend takes no OPTIONS; django_jobs is configured by "
                    "settings.DJANGO_JOBS.",
                    id="django_jobs.E008",
                )
            )
        return messages


def result_id(run_id: int) -> str:
    """The id of the task result of run ``run_id``: the run's id, signed."""
    return Signer(salt=RESULT_ID_SALT).sign(str(run_id))


def run_id(result_id: str) -> int:
    """The id of the run behind a task result id (for ``cancel()``, ``retry()``, the admin).

    Raises ``TaskResultDoesNotExist`` for an id that was not signed with this
    project's ``SECRET_KEY`` or one of its ``SECRET_KEY_FALLBACKS``: a forged,
    tampered or bare run id reads exactly like a missing one.
    """
    try:
        text = Signer(salt=RESULT_ID_SALT).unsign(str(result_id))
    except BadSignature:
        raise TaskResultDoesNotExist(result_id) from None
    # Run ids are bigints, written without leading zeros; anything else names no run.
    if not (text.isascii() and text.isdigit() and str(int(text)) == text and int(text) < 2**63):
        raise TaskResultDoesNotExist(result_id)
    return int(text)


def _validate_options(task: JobsTask) -> None:
    if task.retry is not None and not isinstance(task.retry, RetryPolicy):
        raise InvalidTask(f"retry must be a RetryPolicy, got {task.retry!r}")
    if task.timeout is not None and _seconds(task.timeout) is None:
        raise InvalidTask(f"timeout must be positive seconds or a timedelta, got {task.timeout!r}")
    key = task.concurrency_key
    if not (key is None or isinstance(key, str) or callable(key)):
        raise InvalidTask(f"concurrency_key must be a string or a callable, got {key!r}")
    try:
        concurrency_limit(task.concurrency_limit)
    except (TypeError, ValueError) as exc:
        raise InvalidTask(str(exc)) from None


def _seconds(timeout: object) -> float | None:
    try:
        seconds = conf.to_seconds(timeout)  # type: ignore[arg-type,unused-ignore]
    except TypeError:
        return None
    return seconds if seconds > 0 else None


def _key(task: AnyTask, data: dict[str, Any]) -> str | None:
    key = getattr(task, "concurrency_key", None)
    if callable(key):
        key = key(*data["args"], **data["kwargs"])
    if key is not None and not isinstance(key, str):
        raise InvalidJobInput(f"the concurrency key of {task.module_path} is not a string: {key!r}")
    return key


def _errors(run: JobRun) -> list[TaskError]:
    """The run's recorded error as a ``TaskError``: the latest attempt's (older ones are gone)."""
    from .models import Status

    error = run.error if isinstance(run.error, dict) else {}
    if run.status == Status.CANCELED:
        # The reason given to cancel() (or a close policy's), then how it ended
        # when the worker had to fence the run.
        message = run.cancel_reason or "canceled"
        if error.get("message") and error["message"] != message:
            message = f"{message} ({error['message']})"
        return [
            TaskError(
                exception_class_path="django_jobs.exceptions.JobCanceled",
                traceback=f"JobCanceled: {message}\n",
            )
        ]
    if error.get("type"):
        path = str(error["type"])
        text = error.get("traceback") or f"{path.rpartition('.')[2]}: {error.get('message', '')}\n"
        return [TaskError(exception_class_path=path, traceback=text)]
    return []


# --- the worker's side ----------------------------------------------------------------


def handler_for(task: AnyTask) -> JobHandler:
    """The handler that runs ``task``'s runs, with the task's django_jobs options and,
    over them, those ``DJANGO_JOBS["JOB_OPTIONS"]`` sets for its path."""
    return with_options(_handler_of(task))


def _handler_of(task: AnyTask) -> JobHandler:
    """The handler that runs ``task``'s runs, with the task's own options."""
    job_type = task.module_path
    timeout = getattr(task, "timeout", None)

    def run_task(ctx: Any) -> Any:
        current, result, call_args = _started(ctx.run_id)
        return _returned(current.call(*call_args, **result.kwargs))

    async def run_async_task(ctx: Any) -> Any:
        # On a worker's event loop, many at once: the rows are read where Django
        # runs sync code for async code, the task is awaited here.
        started = sync_to_async(_started, thread_sensitive=True)
        current, result, call_args = await started(ctx.run_id)
        return _returned(await current.acall(*call_args, **result.kwargs))

    return JobHandler(
        job_type=job_type,
        fn=run_async_task if iscoroutinefunction(task.func) else run_task,
        pool=task.queue_name,
        retry=getattr(task, "retry", None) or NO_RETRY,
        timeout=None if timeout is None else _seconds(timeout),
        concurrency_limit=getattr(task, "concurrency_limit", 1),
        priority=task.priority,
        on_end=_task_ended,
        task_arguments=True,
    )


def _started(run_id: int) -> tuple[AnyTask, AnyResult, list[Any]]:
    """Send ``task_started`` for the task's run; the task as enqueued, its result
    and the positional arguments to call it with (its context first, if it takes one)."""
    from .models import JobRun

    run = JobRun.objects.using(conf.get().DATABASE).get(pk=run_id)
    backend = _backend_of(run)
    result = backend.result_of(run)
    task_started.send(type(backend), task_result=result)
    current = result.task
    call_args = list(result.args)
    if current.takes_context:
        call_args.insert(0, TaskContext(task_result=result))
    return current, result, call_args


def _returned(value: Any) -> Any:
    """The task's return value as stored, as Django's own backends normalize it."""
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as exc:
        # The error normalize_json raised, as Django's own backends record
        # it; never retried, since running the task again returns the same.
        never_retried(exc)
        raise


def _task_ended(run_id: int) -> None:
    """Send ``task_finished`` once a task's run has ended, whoever ended it."""
    from .models import FINISHED_STATUSES, JobRun

    run = JobRun.objects.using(conf.get().DATABASE).filter(pk=run_id).first()
    if run is None or run.trigger_source != TASK_SOURCE:
        return
    if run.status not in FINISHED_STATUSES:
        # Retried again already (by another process): its next end sends the signal.
        logger.debug("run=%s was retried before task_finished; not sent", run_id)
        return
    backend = _backend_of(run)
    task_finished.send(type(backend), task_result=backend.result_of(run))


def _backend_of(run: JobRun) -> JobsBackend:
    backend = task_backends[run.trigger_ref]
    if not isinstance(backend, JobsBackend):
        raise ImproperlyConfigured(
            f"run {run.pk} was enqueued by TASKS[{run.trigger_ref!r}], which is not a JobsBackend "
            "in this process's settings"
        )
    return backend


def resolve_task(job_type: str) -> JobHandler | None:
    """The handler of a task named by its module path, when a JobsBackend is configured.

    A worker imports the task's module the first time it meets one of its runs,
    as Django's own task pickling does; the path comes from a row, so it is
    found through ``task_at``'s guard.
    """
    if not configured():
        return None
    task = task_at(job_type, importing=True)
    # registry.get_handler gives it JOB_OPTIONS.
    return None if task is None else _handler_of(task)


def load_option_targets() -> list[str]:
    """Find, before a worker starts, the tasks ``JOB_OPTIONS`` gives a rate limit, so
    that its claims enforce the limits from the first run; return their paths.

    A key naming a task is resolved as a worker resolves a run's task. For a
    pattern, the ``tasks`` modules of the installed apps are imported (as
    ``jobs.py`` modules are), then the tasks of the installed apps' imported
    modules that match it are resolved.
    """
    entries = conf.merged()["JOB_OPTIONS"]
    if not configured() or not isinstance(entries, dict):
        return []
    limited = [
        key
        for key, options in entries.items()
        if isinstance(key, str) and isinstance(options, dict) and "rate_limit" in options
    ]
    if not limited:
        return []
    if any(c in key for key in limited for c in "*?["):
        autodiscover_modules("tasks")
    paths = {key for key in limited if task_at(key, importing=True) is not None}
    paths |= {
        path for path in loaded_tasks() if any(fnmatch.fnmatchcase(path, key) for key in limited)
    }
    found = []
    for path in sorted(paths):
        if task_at(path, importing=False) is not None:
            get_handler(path, resolve=True)
            found.append(path)
    return found


# --- schedules of tasks -------------------------------------------------------------


def schedule_target(path: str, importing: bool) -> Target | None:
    """The task at ``path`` as a schedule's target (``schedules.add_target_lookup``), or None.

    A name written in settings is code: its module may be imported as a worker
    imports a task's (``resolve_task``'s rules). A name read from a row (a
    run-time schedule's) imports nothing: the task must be in a module this
    process has imported already, such as one an installed app's ``jobs.py``
    imports.
    """
    if "." not in path or not configured():
        return None
    task = task_at(path, importing=importing)
    if task is None:
        return None
    try:
        backend = task_backends[task.backend]
    except Exception:  # an alias TASKS does not have (InvalidTaskBackend)
        return None
    if not isinstance(backend, JobsBackend):
        return None
    return Target(
        job_type=path,
        pool=task.queue_name,
        kind="task",
        check_input=partial(scheduled_arguments, task),
        start=partial(backend.start_scheduled, task),
    )


def scheduled_arguments(task: AnyTask, value: Any) -> dict[str, Any]:
    """A schedule's input for ``task`` as its runs get it: ``{"args": [...], "kwargs":
    {...}}`` (either may be left out), arguments the task's function accepts."""
    value = {} if value is None else value
    if not isinstance(value, dict) or not set(value) <= {"args", "kwargs"}:
        raise InvalidJobInput(
            'the input of a task\'s schedule is {"args": [...], "kwargs": {...}}, '
            f"got a {type(value).__name__}"
            + (f" with keys {sorted(map(str, value))[:5]}" if isinstance(value, dict) else "")
        )
    args, kwargs = value.get("args", []), value.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise InvalidJobInput('"args" must be a list and "kwargs" an object')
    call = [None, *args] if task.takes_context else args
    try:
        inspect.signature(task.func).bind(*call, **kwargs)
    except TypeError as exc:
        raise InvalidJobInput(f"the arguments do not fit {task.module_path}: {exc}") from None
    normalized: dict[str, Any] = normalize({"args": args, "kwargs": kwargs}, what="input")
    return normalized


def configured() -> bool:
    """Whether ``settings.TASKS`` names a JobsBackend (or a subclass)."""
    for params in getattr(settings, "TASKS", {}).values():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if isinstance(backend, type) and issubclass(backend, JobsBackend):
            return True
    return False
