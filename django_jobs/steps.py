"""Recording steps: one fenced statement per step, replayed from ``JobStep`` rows."""

from __future__ import annotations

import functools
import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from . import conf
from .claims import Claim
from .models import JobRun, JobStep
from .sql import fetch


def load(run_id: int) -> dict[str, dict[str, Any]]:
    """Return the recorded steps of a run by step id: status, output, attempts."""
    rows = (
        JobStep.objects.using(conf.get().DATABASE)
        .filter(run_id=run_id)
        .values("step_id", "status", "output", "attempts")
    )
    return {row["step_id"]: dict(row) for row in rows}


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

    One statement: the INSERT only happens if the run is still running under
    this lease, and ``FOR SHARE`` keeps it so until this transaction ends, so
    a rescue cannot slip between the check and an atomic step's commit. A
    failed step recorded earlier is overwritten (its attempts counted up).
    ``output_json`` is the output already serialized (it wins over ``output``).
    """
    if output_json is None and error is None:
        output_json = json.dumps(output, cls=DjangoJSONEncoder)
    if error is None:
        # The common case, with fewer parameters to send: each costs the worker
        # a little CPU, and a run of three steps sends three of these.
        completed = {
            "run": claim.run_id,
            "step": step_id,
            "seq": seq,
            "output": output_json,
            "started": None if started_at is None else started_at.timestamp(),
            "token": claim.lease_token,
        }
        return bool(fetch(conf.get().DATABASE, _statement(completed=True), completed))
    failed = {
        "run": claim.run_id,
        "step": step_id,
        "seq": seq,
        "error": json.dumps(error, cls=DjangoJSONEncoder),
        "started": None if started_at is None else started_at.timestamp(),
        "token": claim.lease_token,
    }
    return bool(fetch(conf.get().DATABASE, _statement(completed=False), failed))


@functools.cache
def _statement(*, completed: bool) -> str:
    run_table = JobRun._meta.db_table
    step_table = JobStep._meta.db_table
    status = JobStep.StepStatus.COMPLETED if completed else JobStep.StepStatus.FAILED
    output, error = ("%(output)s::jsonb", "NULL") if completed else ("NULL", "%(error)s::jsonb")
    return f"""
        INSERT INTO {step_table}
            (run_id, step_id, seq, status, attempts, output, error, started_at, finished_at)
        SELECT %(run)s, %(step)s, %(seq)s, '{status}', 1, {output}, {error},
            COALESCE(to_timestamp(%(started)s), now()), now()
        WHERE EXISTS (
            SELECT 1 FROM {run_table}
            WHERE id = %(run)s AND lease_token = %(token)s
            FOR SHARE
        )
        ON CONFLICT (run_id, step_id) DO UPDATE SET
            seq = EXCLUDED.seq,
            status = EXCLUDED.status,
            attempts = {step_table}.attempts + 1,
            output = EXCLUDED.output,
            error = EXCLUDED.error,
            started_at = EXCLUDED.started_at,
            finished_at = EXCLUDED.finished_at
        WHERE {step_table}.status <> 'completed'
        RETURNING 1
    """
