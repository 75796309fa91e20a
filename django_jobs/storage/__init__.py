"""Storage: every statement on the job tables that locks, fences or differs per database.

* ``claiming``: claims in batches (``SELECT ... FOR UPDATE SKIP LOCKED``), and ``Claim``;
* ``ratelimits``: the admission of rate-limited runs at claim, and ``JobRateLimit`` rows;
* ``leases``: the fenced writes to a claimed run, each one conditional ``UPDATE``;
* ``steps``: recording and loading a run's steps;
* ``reading``: reading run rows so that no stored value fails a claim, and
  passing over rows no claim can write;
* ``workers``: Worker rows, heartbeats, and finding the runs of silent workers;
* ``notify``, ``control``, ``connections``: wake-ups, the worker's shared control
  connection, and connections that broke;
* ``vendors``: the statements that differ per database, behind one interface.

Nothing here decides what a run's change implies (a parent to wake, children to
close): that is ``django_jobs.transitions``, the only caller of the writes that
move a run from one status to another, the claim aside.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from .. import conf
from ..models import JobRun


def using() -> str:
    """The alias of the jobs database."""
    return conf.get().DATABASE


def runs() -> Any:
    """``JobRun.objects`` on the jobs database."""
    return JobRun.objects.using(conf.get().DATABASE)


def after(seconds: float) -> ExpressionWrapper[Any]:
    """``now() + seconds`` on the database clock."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )
