"""What an orchestrator's health probe asks (``manage.py jobhealth``): are the
migrations applied, and does a worker here send heartbeats?

Ages are measured on the database's clock, as the rescue that would take a
silent worker's runs measures them, so a host whose clock drifts is judged as
its peers judge it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now

from . import conf
from .models import Worker, WorkerStatus
from .snapshot import POOLS_TEXT, pool_names, read_stored, text_of

# Heartbeats a worker may miss before a probe calls it dead: one late beat (a
# busy control connection delays it by up to half an interval) is not a death.
MISSED_BEATS = 3


def default_max_age() -> float:
    """Seconds since a worker's last heartbeat after which a probe fails it:
    ``MISSED_BEATS`` heartbeat intervals, and never more than the stale threshold,
    past which its peers rescue its runs anyway."""
    settings = conf.get()
    return min(MISSED_BEATS * settings.HEARTBEAT_INTERVAL, settings.STALE_THRESHOLD)


def unapplied_migrations(alias: str) -> list[str]:
    """The migrations of the project not applied on database ``alias``, in the order
    ``migrate`` would apply them (``app.name``); connects, so it raises a
    ``DatabaseError`` for a database that cannot be reached."""
    connection = connections[alias]
    connection.ensure_connection()
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, backwards in plan]


@dataclass(frozen=True)
class Beat:
    """A live worker row and how long ago it sent its last heartbeat."""

    worker_id: str
    hostname: str
    pid: int
    pools: list[str]
    status: str
    age: timedelta


def newest_beat(hostname: str, *, pid: int | None = None, pools: Sequence[str] = ()) -> Beat | None:
    """The live worker (running or stopping) on ``hostname``, of ``pid`` when given,
    serving every pool of ``pools``, whose heartbeat is the most recent; None when
    there is none. A worker registered without pools (it serves them all) serves any."""
    rows = Worker.objects.using(conf.get().DATABASE).filter(
        hostname=hostname, status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING]
    )
    if pid is not None:
        rows = rows.filter(pid=pid)
    since = ExpressionWrapper(Now() - F("heartbeat_at"), output_field=DurationField())
    # The pools are read as text: a row whose JSON cannot be read is passed over
    # (and logged), not the probe's end.
    rows = rows.defer("pools").annotate(
        heartbeat_age=since, pools_text=text_of("pools", POOLS_TEXT)
    )
    # A host runs a few workers; its dead ones are marked lost by their peers.
    for row in rows.order_by("-heartbeat_at")[:1000]:
        served = pool_names(read_stored(row.pools_text, f"worker={row.pk} pools", POOLS_TEXT))
        if isinstance(served, list) and _serves(served, pools):
            return Beat(
                worker_id=str(row.pk),
                hostname=row.hostname,
                pid=row.pid,
                pools=served,
                status=row.status,
                age=max(row.heartbeat_age, timedelta(0)),
            )
    return None


def _serves(served: list[str], wanted: Sequence[str]) -> bool:
    return not served or all(pool in served for pool in wanted)
