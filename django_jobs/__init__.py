"""Durable background jobs for Django, in the database the project already has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "JobContext",
    "RetryAfter",
    "RetryPolicy",
    "Schedule",
    "aadd_schedule",
    "acancel",
    "achange_schedule",
    "add_schedule",
    "adelete_schedule",
    "apause_schedule",
    "aresume_schedule",
    "aretry",
    "asend_event",
    "astart",
    "astart_many",
    "cancel",
    "change_schedule",
    "delete_schedule",
    "job",
    "pause_schedule",
    "resume_schedule",
    "retry",
    "send_event",
    "start",
    "start_many",
]

if TYPE_CHECKING:
    from .api import acancel, aretry, astart, astart_many, cancel, retry, start, start_many
    from .backoff import RetryPolicy
    from .context import JobContext
    from .events import asend_event, send_event
    from .exceptions import RetryAfter
    from .registry import job
    from .schedule_api import (
        aadd_schedule,
        achange_schedule,
        add_schedule,
        adelete_schedule,
        apause_schedule,
        aresume_schedule,
        change_schedule,
        delete_schedule,
        pause_schedule,
        resume_schedule,
    )
    from .schedules import Schedule

_LAZY = {
    "acancel": "api",
    "aretry": "api",
    "astart": "api",
    "astart_many": "api",
    "cancel": "api",
    "retry": "api",
    "start": "api",
    "start_many": "api",
    "JobContext": "context",
    "send_event": "events",
    "asend_event": "events",
    "RetryAfter": "exceptions",
    "job": "registry",
    "RetryPolicy": "backoff",
    "Schedule": "schedules",
    **{
        name: "schedule_api"
        for name in (
            "add_schedule",
            "change_schedule",
            "pause_schedule",
            "resume_schedule",
            "delete_schedule",
            "aadd_schedule",
            "achange_schedule",
            "apause_schedule",
            "aresume_schedule",
            "adelete_schedule",
        )
    },
}


def __getattr__(name: str) -> Any:
    # Lazy, so ``import django_jobs`` works before Django's app registry is ready
    # (settings files import RetryPolicy; models cannot be imported that early).
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobs' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
