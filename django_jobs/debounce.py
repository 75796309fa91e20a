"""Debounced starts: ``start(..., idempotency_key=K, debounce=seconds)``.

While the run of key ``K`` has not started (pending, never claimed), a new start
moves it to now + ``debounce`` and gives it the new input and options (the last
one wins: its concurrency and rate keys, priority, pool and tags too)
instead of adding a run; once it has started, a new start makes a new run,
which takes the key over (the started run keeps running without it). Starts of
one key queue on the existing run's row lock, so concurrent starts leave one
run, with the input of the start that committed last.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from . import conf
from .models import JobRun, Status

# Starts that lose a race for the key look again this many times (each loss
# means another start inserted the run they will then find).
_TRIES = 5


def start_debounced(run: JobRun) -> JobRun:
    """Insert ``run`` (unsaved, its key and ``run_at`` set), or move the unstarted
    run of its key to ``run.run_at`` with ``run.input``; the run that will run."""
    using = conf.get().DATABASE
    runs = JobRun.objects.using(using)
    same = runs.filter(
        job_type=run.job_type, idempotency_key=run.idempotency_key, tenant_id=run.tenant_id
    )
    for _ in range(_TRIES):
        with transaction.atomic(using=using):
            found = same.select_for_update().values("id", "status", "started_at").first()
            if (
                found is not None
                and found["started_at"] is None
                and found["status"] == Status.PENDING
            ):
                # The last start's input, and what was derived from it and from
                # its options (its keys, priority, pool, tags), win.
                runs.filter(pk=found["id"]).update(
                    input=run.input,
                    run_at=run.run_at,
                    turn=run.turn,
                    hold=run.hold,
                    concurrency_key=run.concurrency_key,
                    concurrency_limit=run.concurrency_limit,
                    rate_key=run.rate_key,
                    priority=run.priority,
                    pool=run.pool,
                    tags=run.tags,
                )
                moved: JobRun = runs.get(pk=found["id"])
                return moved
            if found is not None:
                # Started: the key passes to the new run (unique while it is held).
                runs.filter(pk=found["id"]).update(idempotency_key=None)
            try:
                with transaction.atomic(using=using):
                    run.save(using=using, force_insert=True)
            except IntegrityError:
                continue  # another start inserted the key's run first: move that one
            return run
    raise RuntimeError(
        f"start(debounce=...) of {run.job_type} key {run.idempotency_key!r} lost the race "
        f"for its key {_TRIES} times"
    )
