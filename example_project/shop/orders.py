"""Make the demo's orders and enqueue the runs of their pipeline."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import transaction

from django_jobs.models import JobRun, JobRunQuerySet
from django_jobs.registry import JobHandler

from .jobs import fulfil_order, send_receipt, sync_ledger

# Every job type of the demo starts with this; used to find (and clear) its runs.
JOB_TYPE_PREFIX = "shop."
PIPELINE: tuple[JobHandler, ...] = (fulfil_order, send_receipt, sync_ledger)
# Express orders jump the queue: workers claim the highest priority first.
EXPRESS_PRIORITY = 10
SKUS = ("mug-blue", "tee-m", "tee-l", "poster-a2", "socks-3pack")


def demo_runs() -> JobRunQuerySet:
    """Return the QuerySet of the demo's runs."""
    return JobRun.objects.filter(job_type__startswith=JOB_TYPE_PREFIX)


def clear_demo_runs() -> int:
    """Delete the runs of earlier demos; return how many rows went."""
    deleted, _ = demo_runs().delete()
    return deleted


def make_order(order_id: int) -> dict[str, Any]:
    """Return the order ``order_id`` as a job input; every 4th order is express."""
    return {
        "order_id": order_id,
        "sku": SKUS[order_id % len(SKUS)],
        "quantity": 1 + order_id % 3,
        "total_cents": 1299 + 250 * (order_id % 7),
        "email": f"customer{order_id}@example.com",
        "express": order_id % 4 == 0,
    }


def enqueue_orders(runs: int) -> list[JobRun]:
    """Enqueue ``runs`` runs: each order's fulfilment, receipt and ledger entry, in turn.

    One ``start_many`` (one INSERT) per job type and priority, all in one transaction.
    """
    batches: dict[tuple[JobHandler, int | None], list[dict[str, Any]]] = defaultdict(list)
    for index in range(runs):
        order = make_order(index // len(PIPELINE) + 1)
        priority = EXPRESS_PRIORITY if order["express"] else None
        batches[PIPELINE[index % len(PIPELINE)], priority].append(order)
    created: list[JobRun] = []
    with transaction.atomic():
        for (handler, priority), inputs in batches.items():
            created += handler.start_many(inputs, priority=priority)
    return created


def pools() -> list[str]:
    """Return the pools the demo's handlers use, which its workers must serve."""
    return sorted({handler.pool for handler in PIPELINE})
