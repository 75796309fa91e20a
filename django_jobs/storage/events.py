"""Events sent to runs: stored, taken by a wait (the oldest of a name first), read back.

A run's events are written and taken under the run's row lock (``transitions``):
the lock orders a send against the wait that suspends the run, so an event is
never stored between a wait's look and its suspension unseen.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import ExpressionWrapper, F, TextField
from django.db.models.functions import Now

from ..models import JobEvent
from . import using
from .reading import decoded


def events() -> Any:
    return JobEvent.objects.using(using())


def store(run_id: int, name: str, payload: Any) -> JobEvent:
    """Add an event ``name`` with ``payload`` (already JSON-normalized) for run ``run_id``."""
    event: JobEvent = events().create(run_id=run_id, name=name, payload=payload)
    return event


def take(run_id: int, name: str, step_key: str, sent_by: datetime | None) -> dict[str, Any] | None:
    """Consume the oldest unconsumed event ``name`` of run ``run_id`` (sent by ``sent_by``
    when given), marking it taken by ``step_key``; its ``{"event", "payload"}``, or
    None when there is none. The caller holds the run's row lock."""
    waiting = events().filter(run_id=run_id, name=name, consumed_at__isnull=True)
    if sent_by is not None:
        waiting = waiting.filter(sent_at__lte=sent_by)
    row = (
        waiting.order_by("id")
        # As stored, decoded here: a row written by hand may not decode.
        .values("id", text=ExpressionWrapper(F("payload"), output_field=TextField()))
        .first()
    )
    if row is None:
        return None
    try:
        payload = decoded(row["text"])
    except ValueError as exc:
        # Left where it is; the wait fails (a row only a hand could write).
        raise ValueError(f"the payload of event {row['id']} ({name!r}) {exc}") from None
    events().filter(pk=row["id"]).update(consumed_at=Now(), consumed_by=step_key)
    return {"event": row["id"], "payload": payload}


def give_back(run_id: int) -> int:
    """Make every event run ``run_id`` consumed pending again (a retry that resets its
    steps replays its waits, which then take them again, in order)."""
    return int(
        events()
        .filter(run_id=run_id, consumed_at__isnull=False)
        .update(consumed_at=None, consumed_by="")
    )
