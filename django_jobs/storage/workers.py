"""Worker rows: registration, heartbeats, and the running runs of silent workers.

Liveness is the holder's heartbeat, never the run's age: a long job on a live
worker is left alone however long it runs. What happens to a silent worker's
runs is ``transitions.rescue_stale``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from ..models import JobPool, Status, Worker, WorkerStatus
from . import runs, using


def register_worker(
    hostname: str,
    pid: int,
    pools: Sequence[str] | None,
    concurrency: int,
    worker_id: uuid.UUID | None = None,
) -> Worker:
    """Insert this worker's row (again, under the same id, when ``worker_id`` is given)."""
    worker = Worker(
        id=worker_id or uuid.uuid4(),
        hostname=hostname,
        pid=pid,
        pools=list(pools or []),
        concurrency=concurrency,
    )
    worker.save(using=using(), force_insert=True)
    if pools:
        # The admin's pool list shows every pool a worker has served.
        record_pools(pools)
    return worker


def record_pools(names: Iterable[str]) -> None:
    """Make a row for each pool a worker serves, so the admin lists it (idempotent)."""
    JobPool.objects.using(using()).bulk_create(
        [JobPool(name=name) for name in names], ignore_conflicts=True
    )


def heartbeat(worker_id: uuid.UUID, status: str) -> bool:
    """Record that this worker is alive; False when its row is gone."""
    return bool(
        Worker.objects.using(using()).filter(pk=worker_id).update(heartbeat_at=Now(), status=status)
    )


def stop_worker(worker_id: uuid.UUID) -> None:
    Worker.objects.using(using()).filter(pk=worker_id).update(
        status=WorkerStatus.STOPPED, stopped_at=Now(), heartbeat_at=Now()
    )


def _silent_since(stale_after: float) -> ExpressionWrapper[Any]:
    return ExpressionWrapper(
        Now() - Value(timedelta(seconds=stale_after)), output_field=DateTimeField()
    )


def mark_lost(stale_after: float) -> int:
    """Mark the live workers silent for ``stale_after`` seconds lost; return how many.

    Found without a lock, then one ``UPDATE`` by primary key each, which checks
    the silence again, in statements of their own: no worker row stays locked
    while their runs are swept. Not one ``UPDATE`` over the (status,
    heartbeat_at) index: that locked the index entry, then the row, where a
    heartbeat locks the row, then the entry it changes, and a worker beating
    just as it was found silent deadlocked the two (MariaDB, issue 32).
    """
    silent = Worker.objects.using(using()).filter(
        status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING],
        heartbeat_at__lt=_silent_since(stale_after),
    )
    found = sorted(silent.values_list("pk", flat=True))
    return sum(
        int(silent.filter(pk=worker_id).update(status=WorkerStatus.LOST)) for worker_id in found
    )


def stale_runs(pools: Sequence[str] | None, stale_after: float) -> Any:
    """Running runs (of ``pools``) whose worker is gone or silent for ``stale_after`` seconds."""
    # The silent workers as a subquery, not a join: locking these runs must not
    # lock Worker rows too (where a lock cannot name its table: MariaDB).
    silent = Worker.objects.using(using()).filter(heartbeat_at__lt=_silent_since(stale_after))
    stale = Q(claimed_by__isnull=True) | Q(claimed_by__in=silent.values("pk"))
    found = runs().filter(stale, status=Status.RUNNING)
    return found if pools is None else found.filter(pool__in=pools)
