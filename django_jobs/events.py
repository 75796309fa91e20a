"""Events into runs: ``send_event`` delivers one, a handler's ``ctx.wait_for_event`` takes it.

An event joins the sender's transaction: it is stored, and the run it wakes is
made pending, only if that transaction commits (a listening worker is told at
commit). Events are kept until a wait of their name takes them, the oldest
first, each by one wait; the run's page lists them.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from . import conf, transitions
from .api import _refuse_event_loop, made_due
from .models import JobEvent, JobRun
from .names import event_name
from .payloads import to_json
from .signals import event_sent


def send_event(
    run: JobRun | int, name: str, payload: Any = None, *, tenant_id: str | None = None
) -> JobEvent:
    """Send the event ``name`` with ``payload`` (JSON, bounded as inputs are) to ``run``
    (a run or its id); return the stored event. Joins the caller's transaction.

    The run's next ``ctx.wait_for_event(name)`` returns ``payload``; if it waits for
    that name now, it is woken at commit. Sending to a finished run raises
    ``InvalidTransition``, to a missing run (or, with ``tenant_id``, another
    tenant's) ``RunNotFound``: nothing is stored.
    """
    _refuse_event_loop("send_event")
    run_id = run.pk if isinstance(run, JobRun) else run
    name = event_name(name)
    value = json.loads(to_json(payload, what=f"the payload of event {name!r}"))
    event, job_type = transitions.deliver_event(run_id, name, value, tenant_id)
    if event_sent.receivers:
        transaction.on_commit(
            lambda: event_sent.send_robust(
                JobRun, run_id=event.run_id, job_type=job_type, name=name, event_id=event.pk
            ),
            using=conf.get().DATABASE,
        )
    made_due([run] if isinstance(run, JobRun) else [])
    return event


async def asend_event(
    run: JobRun | int, name: str, payload: Any = None, *, tenant_id: str | None = None
) -> JobEvent:
    """``send_event`` for async code."""
    return await sync_to_async(send_event, thread_sensitive=True)(
        run, name, payload, tenant_id=tenant_id
    )
