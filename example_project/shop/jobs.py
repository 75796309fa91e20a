"""The order pipeline's job handlers, registered with ``@job`` (autodiscovered)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django_jobs import JobContext, RetryPolicy, job

from . import services
from .services import OutOfStock


@job(
    "shop.fulfil_order",
    pool="orders",
    retry=RetryPolicy(
        attempts=4,
        backoff="exponential",
        base_delay=0.05,  # seconds; a real shop would wait longer between attempts
        max_delay=1.0,
        non_retryable=[OutOfStock],
    ),
    timeout=timedelta(minutes=5),
    concurrency_key=lambda order: f"order:{order['order_id']}",
)
def fulfil_order(ctx: JobContext) -> dict[str, Any]:
    """Reserve the stock and capture the payment of one order."""
    order = ctx.input
    order_id = order["order_id"]
    # Both calls run again on a retry; the warehouse and the gateway treat a
    # repeated call for the same order as the same request.
    reservation = services.reserve_stock(order_id, order["sku"], order["quantity"])
    charge_id = services.charge(order_id, order["total_cents"], attempt=ctx.attempt)
    ctx.logger.info("order=%s fulfilled attempt=%d", order_id, ctx.attempt)
    return {"reservation": reservation, "charge_id": charge_id}


@job(
    "shop.send_receipt",
    pool="mail",
    # A rejected address is matched by its ``code``: retrying it would bounce again.
    retry=RetryPolicy(attempts=3, base_delay=0.05, non_retryable=["address_rejected"]),
)
def send_receipt(ctx: JobContext) -> dict[str, Any]:
    """E-mail the customer the receipt of one order."""
    order = ctx.input
    message_id = services.send_mail(
        order["email"], f"Your receipt for order {order['order_id']}", order_id=order["order_id"]
    )
    ctx.logger.info("order=%s receipt sent", order["order_id"])
    return {"message_id": message_id}


@job(
    "shop.sync_ledger",
    retry=RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.5),
)
def sync_ledger(ctx: JobContext) -> dict[str, Any]:
    """Book one order in the accounting system, whose API is sometimes down."""
    order = ctx.input
    entry_id = services.post_ledger_entry(
        order["order_id"], order["total_cents"], attempt=ctx.attempt
    )
    ctx.logger.info("order=%s booked entry=%s run=%s", order["order_id"], entry_id, ctx.run_id)
    return {"entry_id": entry_id}
