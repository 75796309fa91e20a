"""Batched completion: the outcomes of many runs written in one statement.

A durable commit costs about as much as a short run. So a worker's threads
hand their successful outcomes to one ``Completer``, which writes whatever
has gathered while its previous write was in flight (group commit, no fixed
wait) in one ``UPDATE ... FROM (VALUES ...)``,
fenced per run exactly like a single write: a row is only changed while it is
``running`` under the lease token given with it. Each thread waits for its
own row's result, so a run is only reported completed once that is durable.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from . import conf
from .claims import Claim
from .models import JobRun, Status

logger = logging.getLogger(__name__)

# The most outcomes written in one statement.
MAX_BATCH = 500


@dataclass(eq=False)
class _Pending:
    claim: Claim
    output: Any
    done: threading.Event = field(default_factory=threading.Event)
    written: bool = False
    error: BaseException | None = None


class Completer:
    """Gathers completions from worker threads and writes them in batches."""

    def __init__(self) -> None:
        self._items: list[_Pending] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop, name="django-jobs-completer", daemon=True
        )
        self._thread.start()

    def complete(self, claim: Claim, output: Any) -> bool:
        """Mark the run completed with ``output``; False when the lease was lost.

        Raises the database error of the batch's write, if it failed: the caller
        (``execution.settle``) retries on a fresh connection as for one write.
        """
        item = _Pending(claim, output)
        with self._lock:
            closed = self._closed
            if not closed:
                self._items.append(item)
                self._lock.notify()
        if closed:
            # A handler that outlived the worker's drain: write it alone.
            return bool(complete_many([(claim, output)]))
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.written

    def close(self) -> None:
        """Write what is gathered, then stop (pending callers get their results)."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._items and not self._closed:
                        self._lock.wait()
                    if not self._items and self._closed:
                        return
                    batch, self._items = self._items[:MAX_BATCH], self._items[MAX_BATCH:]
                self._flush(batch)
        finally:
            connections.close_all()

    def _flush(self, batch: list[_Pending]) -> None:
        from .execution import discard_broken_connections

        try:
            written = complete_many([(item.claim, item.output) for item in batch])
        except (OperationalError, InterfaceError) as exc:
            # The connection broke: every caller retries on its own (settle).
            discard_broken_connections()
            for item in batch:
                item.error = exc
                item.done.set()
            return
        except DatabaseError:
            # One row the database refused must not fail its neighbours: write
            # them one by one, so only the bad one gets the error.
            discard_broken_connections()
            for item in batch:
                self._flush_one(item)
            return
        for item in batch:
            item.written = (item.claim.run_id, item.claim.lease_token) in written
            item.done.set()

    def _flush_one(self, item: _Pending) -> None:
        try:
            item.written = bool(complete_many([(item.claim, item.output)]))
        except DatabaseError as exc:
            item.error = exc
        item.done.set()


def complete_many(items: list[tuple[Claim, Any]]) -> set[tuple[int, uuid.UUID]]:
    """Complete many runs in one statement, each fenced on its lease.

    Returns the (run id, lease token) pairs written: a stale claim of a run
    that was claimed again is told apart from the current one by its token.
    """
    using = conf.get().DATABASE
    connection = connections[using]
    if connection.vendor != "postgresql":
        from . import claims

        return {
            (claim.run_id, claim.lease_token)
            for claim, output in items
            if claims.complete(claim, output)
        }
    # In id order, so that two writers never lock the same rows in opposite orders.
    items = sorted(items, key=lambda item: item[0].run_id)
    values = ", ".join(["(%s::bigint, %s::uuid, %s::jsonb)"] * len(items))
    params: list[Any] = []
    for claim, output in items:
        params += [
            claim.run_id,
            claim.lease_token,
            None if output is None else json.dumps(output, cls=DjangoJSONEncoder),
        ]
    table = JobRun._meta.db_table
    sql = f"""
        UPDATE {table} AS run
        SET status = %s, output = v.output, finished_at = now(), lease_token = NULL
        FROM (VALUES {values}) AS v(id, token, output)
        WHERE run.id = v.id AND run.status = %s AND run.lease_token = v.token
        RETURNING run.id, v.token
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [Status.COMPLETED, *params, Status.RUNNING])
        return {(row[0], row[1]) for row in cursor.fetchall()}
