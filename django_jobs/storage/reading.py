"""Reading run rows that anyone who can write the table may have written, and
``Claim``: a run this worker holds, as the claim read it.

The database is trusted, but one bad row must not stop the others. A claim
reads the columns Python could fail to read as the database stores them, and
decodes them itself (``claimed_values``, ``decoded``): JSON nested past
Python's recursion limit (PostgreSQL's jsonb holds 10,000 levels), a number of
more digits than ``int()`` converts, text that is not JSON where a CHECK was
bypassed, a date outside Python's years (PostgreSQL holds up to 294276, and
infinity). Such a run's claim says it is ``unreadable``, and it fails alone.

A row the database refuses to change as a claim does is passed over instead
(``find_unwritable``, ``passed_over``): nothing, a failure included, can be
written to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import DataError, IntegrityError, transaction
from django.db.models import (
    BooleanField,
    Case,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    TextField,
    When,
)
from django.db.models.functions import Now

from ..models import JobRun, JobStep, Status
from . import runs, using
from .leases import WorkerIds

logger = logging.getLogger(__name__)

# The columns a worker needs to execute a claimed run; read in the claim itself.
CLAIM_FIELDS = (
    "id",
    "job_type",
    "pool",
    "priority",
    "input",
    "attempts",
    "max_attempts",
    "tenant_id",
    "parent_id",
    "root_id",
    "created_at",
    "run_at",
    "concurrency_key",
    "cancel_requested_at",
    "trace_context",
)
# The columns a claim reads as the database stores them, for itself to decode: a
# value Python cannot read (anyone who can write the table can store one) then
# fails its own run, not the claim of every run with it.
JSON_FIELDS = ("input", "trace_context")
DATE_FIELDS = ("created_at", "run_at", "cancel_requested_at")
# The instants Python's datetime holds, with a day to spare for time zones. A
# date outside them (PostgreSQL stores years up to 294276, and infinity) is read
# as NULL, and the row's ``dates_ok`` says so.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
# What claiming.claim_of reads, named in the order of the one-statement claim's
# columns (CLAIM_FIELDS, then has_steps and dates_ok).
RETURNED = (
    *(
        f"{name}_text" if name in JSON_FIELDS else f"{name}_read" if name in DATE_FIELDS else name
        for name in CLAIM_FIELDS
    ),
    "has_steps",
    "dates_ok",
)


def unreadable(problem: str) -> str:
    return f"the run's stored {problem}; its handler was not called"


def decoded(text: Any) -> Any:
    """A JSON column's stored text, decoded; ``ValueError`` saying why it cannot be."""
    if text is None:
        return None
    if text == "{}":
        return {}
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("is nested too deeply for Python to decode") from None
    except (TypeError, ValueError) as exc:
        # The reason, not the value: the error is stored and shown.
        reason = str(exc).split(":", 1)[0][:100]
        raise ValueError(f"is not JSON Python can decode ({reason})") from None


def claimed_values(rows: Any, *extra: str) -> Any:
    """``rows`` read for ``claim_of``: ``CLAIM_FIELDS`` (and ``extra``), whether each
    run has recorded steps, its JSON columns as stored text, and its dates, NULL
    where Python could not hold them (``dates_ok`` is then false). No stored value
    can make this read fail."""
    steps = JobStep.objects.using(using()).filter(run_id=OuterRef("pk"))
    plain = [name for name in CLAIM_FIELDS if name not in JSON_FIELDS + DATE_FIELDS]
    texts = {
        f"{name}_text": ExpressionWrapper(F(name), output_field=TextField()) for name in JSON_FIELDS
    }
    dates = {
        f"{name}_read": Case(When(_in_range(name), then=F(name)), output_field=DateTimeField())
        for name in DATE_FIELDS
    }
    dates_ok = ExpressionWrapper(
        _in_range("created_at")
        & _in_range("run_at")
        & (Q(cancel_requested_at__isnull=True) | _in_range("cancel_requested_at")),
        output_field=BooleanField(),
    )
    return rows.annotate(has_steps=Exists(steps)).values(
        *plain, *extra, "has_steps", **texts, **dates, dates_ok=dates_ok
    )


def _in_range(name: str) -> Q:
    return Q(**{f"{name}__gte": EARLIEST, f"{name}__lte": LATEST})


# Runs whose row the database refuses to change as a claim does (MariaDB checks
# every JSON column's CHECK at any UPDATE, so a value stored past it makes the
# row unwritable; a counter at its type's maximum cannot count another attempt):
# the id, and until when (time.monotonic()) this process's claims pass it over.
# No write can fail such a run either; it stays pending, logged, until someone
# mends or deletes its row.
_UNWRITABLE_FOR = 600.0
_unwritable: dict[int, float] = {}


class _Probed(Exception):
    """Rolls a probe's transaction back."""


def passed_over() -> list[int]:
    """The runs this process's claims pass over, their row being unwritable."""
    if not _unwritable:
        return []
    now = time.monotonic()
    for run_id in [run_id for run_id, until in _unwritable.items() if until <= now]:
        del _unwritable[run_id]  # looked at again: it may have been mended
    return sorted(_unwritable)


def find_unwritable(ids: list[int], worker_id: uuid.UUID) -> bool:
    """After a claim of ``ids`` was refused: note the rows the claim's UPDATE cannot
    change, each tried alone in a transaction rolled back (status aside, which a
    key's unique index may refuse for a good reason); whether any was found."""
    found = False
    for run_id in ids:
        try:
            with transaction.atomic(using=using()):
                runs().filter(pk=run_id, status=Status.PENDING).update(
                    attempts=F("attempts") + 1,
                    started_at=Now(),
                    worker_ids=WorkerIds(worker_id),
                )
                raise _Probed
        except _Probed:
            continue
        except (IntegrityError, DataError) as exc:
            _unwritable[run_id] = time.monotonic() + _UNWRITABLE_FOR
            found = True
            logger.error(
                "run=%s passed over by claims for %ds: the database refuses to change "
                "its row (%s); mend or delete it",
                run_id,
                _UNWRITABLE_FOR,
                str(exc)[:200],
            )
    return found


@dataclass(slots=True)
class Claim:
    """A run this worker holds: the row as claimed, plus the lease that fences it.

    Not changed once made (``dataclasses.replace`` makes a changed copy). Not
    frozen only because a frozen dataclass costs several times as much to build,
    and a worker builds one per run.
    """

    run_id: int
    attempt: int  # this attempt's number, counted at claim
    lease_token: uuid.UUID
    job_type: str = ""
    pool: str = "default"
    priority: int = 0
    input: Any = field(default_factory=dict)
    max_attempts: int = 1
    tenant_id: str | None = None
    parent_id: int | None = None
    root_id: int | None = None
    created_at: datetime | None = None
    run_at: datetime | None = None
    concurrency_key: str | None = None
    cancel_requested_at: datetime | None = None
    trace_context: Any = None  # as stored: read by tracing.parse() only
    # Whether the run had recorded steps when claimed; None when not known.
    has_steps: bool | None = None
    # Why the claimed row could not be read (its input is not JSON Python can
    # decode, say), or None. Such a claim's handler must not be called: its run
    # fails at once, not retried (another attempt would read the same row).
    unreadable: str | None = None

    @classmethod
    def from_row(
        cls, row: dict[str, Any], lease_token: uuid.UUID, has_steps: bool | None = None
    ) -> Claim:
        """The claim of a row of ``CLAIM_FIELDS`` (``attempts`` already counted)."""
        return cls(
            run_id=int(row["id"]),
            attempt=int(row["attempts"]),
            lease_token=lease_token,
            job_type=row["job_type"],
            pool=row["pool"],
            priority=row["priority"],
            input=row["input"],
            max_attempts=int(row["max_attempts"]),
            tenant_id=row["tenant_id"],
            parent_id=row["parent_id"],
            root_id=row["root_id"],
            created_at=row["created_at"],
            run_at=row["run_at"],
            concurrency_key=row["concurrency_key"],
            cancel_requested_at=row["cancel_requested_at"],
            trace_context=row["trace_context"],
            has_steps=has_steps,
        )

    def as_run(self) -> JobRun:
        """The run as claimed, built without a query."""
        return JobRun(  # type: ignore[misc]  # the claimed row has both dates
            id=self.run_id,
            job_type=self.job_type,
            pool=self.pool,
            priority=self.priority,
            input=self.input,
            attempts=self.attempt,
            max_attempts=self.max_attempts,
            tenant_id=self.tenant_id,
            parent_id=self.parent_id,
            root_id=self.root_id,
            created_at=self.created_at,
            run_at=self.run_at,
            concurrency_key=self.concurrency_key,
            cancel_requested_at=self.cancel_requested_at,
            trace_context=self.trace_context,
            status=Status.RUNNING,
            lease_token=self.lease_token,
        )


def claim_of(row: dict[str, Any], token: uuid.UUID) -> Claim:
    """The claim of a row read by ``claimed_values`` (``attempts`` already counted).

    Its JSON is decoded here: an input that cannot be, or a date outside Python's
    years, makes the claim ``unreadable`` (its run fails alone); a trace context
    that cannot be stays the text it is, which tracing ignores.
    """
    problem = None
    try:
        value = decoded(row["input_text"])
    except ValueError as exc:
        value, problem = None, f"input {exc}"
    trace = row["trace_context_text"]
    with contextlib.suppress(ValueError):  # kept as text, which tracing.parse() ignores
        trace = decoded(trace)
    if not row["dates_ok"]:
        problem = problem or "dates are outside the years Python reads (1-9999)"
    return Claim(
        run_id=int(row["id"]),
        attempt=int(row["attempts"]),
        lease_token=token,
        job_type=row["job_type"],
        pool=row["pool"],
        priority=row["priority"],
        input=value,
        max_attempts=int(row["max_attempts"]),
        tenant_id=row["tenant_id"],
        parent_id=row["parent_id"],
        root_id=row["root_id"],
        created_at=row["created_at_read"],
        run_at=row["run_at_read"],
        concurrency_key=row["concurrency_key"],
        cancel_requested_at=row["cancel_requested_at_read"],
        trace_context=trace,
        has_steps=bool(row["has_steps"]),
        unreadable=None if problem is None else unreadable(problem),
    )
