"""Locking runs for a transition: by primary key alone, in id order, parents first.

The rules are those of ``transitions`` (its docstring): a statement that finds
runs by another column reads their ids without a lock, then locks them by id
here, decides on what it reads under the lock, and writes by id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .exceptions import RunNotFound
from .models import JobRun
from .storage import runs


def lock_parent(parent_id: int | None) -> None:
    """Lock a run's parent row first (see the locking rules above)."""
    if parent_id is not None:
        list(runs().select_for_update().filter(pk=parent_id).values_list("id"))


def lock_rows(
    run_ids: Iterable[int], *fields: str, skip_locked: bool = False, **expressions: Any
) -> list[dict[str, Any]]:
    """Lock the rows of ``run_ids`` by primary key alone, in id order, in the caller's
    transaction; return their id, ``fields`` and ``expressions`` as read under the lock.

    The statement names the primary key and nothing else, so that no database
    reads (and locks) an index entry of another run (see the locking rules
    above). With ``skip_locked``, rows another transaction holds are left out.
    """
    ids = sorted(set(run_ids))
    if not ids:
        return []
    locked = runs().select_for_update(skip_locked=skip_locked).filter(pk__in=ids).order_by("pk")
    return list(locked.values("id", *fields, **expressions))


def change_locked(
    run_ids: Iterable[int], wanted: Callable[[dict[str, Any]], bool], *fields: str, **changes: Any
) -> list[dict[str, Any]]:
    """Lock the rows of ``run_ids``, then write ``changes`` to those ``wanted`` (given
    their status and ``fields``, read under the lock) by primary key; the rows changed.

    The condition is the one a conditional ``UPDATE`` would have, decided under
    the lock; the ``UPDATE`` names the ids alone (see the locking rules above).
    """
    rows = [row for row in lock_rows(run_ids, "status", *fields) if wanted(row)]
    if rows:
        runs().filter(pk__in=[row["id"] for row in rows]).update(**changes)
    return rows


def lock_run(run_id: int, tenant_id: str | None = None, *, parent_first: bool = False) -> JobRun:
    """Return run ``run_id`` locked for update, within ``tenant_id`` when given.

    With ``parent_first``, the run's parent is locked before the run, for
    changes that may wake it. Another tenant's run reads like a missing one,
    and costs what a missing one costs: the tenant is a condition of the
    statement that finds the run, so another tenant's row is neither locked
    nor read, and only the columns a transition decides on are loaded (never
    a payload).
    """
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise RunNotFound(f"run ids are integers, got {run_id!r}")
    found = runs().filter(pk=run_id)
    if tenant_id is not None:
        found = found.filter(tenant_id=tenant_id)
    if parent_first:
        # None for a run without a parent and for a missing one alike.
        lock_parent(found.values_list("parent_id", flat=True).first())
    run: JobRun | None = (
        found.select_for_update()
        .only("id", "job_type", "status", "pool", "parent_id", "tenant_id")
        .first()
    )
    if run is None:
        # The same answer whether the run is missing or another tenant's.
        raise RunNotFound(f"no run with id {run_id}")
    return run
