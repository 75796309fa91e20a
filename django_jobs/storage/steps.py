"""Recording steps: one fenced statement per step, replayed from ``JobStep`` rows."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.db.models import ExpressionWrapper, F, TextField

from ..exceptions import InvalidStepOutput
from ..models import JobStep
from . import using, vendors
from .reading import decoded

if TYPE_CHECKING:
    from .claiming import Claim


def load(run_id: int) -> dict[str, dict[str, Any]]:
    """Return the recorded steps of a run by step id: status, output, attempts.

    Raises ``InvalidStepOutput`` naming a completed step whose stored output
    cannot be decoded (nested past Python's recursion limit, a number of more
    digits than ``int()`` converts: anyone who can write the table can store
    one): its run cannot replay it, on this attempt or any other.
    """
    rows = (
        JobStep.objects.using(using())
        .filter(run_id=run_id)
        .values(
            "step_id",
            "status",
            "attempts",
            # As stored, decoded below: the field would raise for the whole read.
            output_text=ExpressionWrapper(F("output"), output_field=TextField()),
        )
    )
    loaded: dict[str, dict[str, Any]] = {}
    for values in rows:
        row: dict[str, Any] = dict(values)
        text = row.pop("output_text")
        try:
            row["output"] = decoded(text)
        except ValueError as exc:
            if row["status"] != JobStep.StepStatus.COMPLETED:
                row["output"] = None  # never replayed
            else:
                raise InvalidStepOutput(
                    f"the stored output of step {row['step_id']!r} {exc}; the run cannot replay it"
                ) from None
        loaded[row["step_id"]] = row
    return loaded


def record(
    claim: Claim,
    step_id: str,
    seq: int,
    *,
    output: Any = None,
    output_json: str | None = None,
    error: dict[str, Any] | None = None,
    started_at: Any = None,
) -> bool:
    """Store a step's outcome while the run's lease holds; False when it does not.

    One statement: the row is only written while the run is still running under
    this lease, and the run stays so until this transaction ends, so a rescue
    cannot slip between the check and an atomic step's commit. A failed step
    recorded earlier is overwritten (its attempts counted up). ``output_json`` is
    the output already serialized (it wins over ``output``).
    """
    connection = connections[using()]
    started = None if started_at is None else started_at.timestamp()
    if error is None:
        if output_json is None:
            output_json = json.dumps(output, cls=DjangoJSONEncoder)
        # The common case, with fewer parameters to send: each costs the worker
        # a little CPU, and a run of three steps sends three of these.
        completed = {
            "run": claim.run_id,
            "step": step_id,
            "seq": seq,
            "output": output_json,
            "started": started,
            "token": claim.lease_token,
        }
        return vendors.of(connection).record_step(connection, completed, completed=True)
    failed = {
        "run": claim.run_id,
        "step": step_id,
        "seq": seq,
        "error": json.dumps(error, cls=DjangoJSONEncoder),
        "started": started,
        "token": claim.lease_token,
    }
    return vendors.of(connection).record_step(connection, failed, completed=False)
