"""Stand-ins for the shop's external systems, failing deterministically.

Each outcome depends only on the order id and the attempt number, so every demo
run ends with the same summary:

* every 37th order is out of stock (retrying cannot help);
* the payment gateway times out on the first two attempts for every 11th order;
* the ledger API is unavailable on the first attempt for every 5th order;
* the mail server rejects the address of every 47th customer (retrying cannot help).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

# Simulated latency of one call to an external system.
CALL_SECONDS = 0.005


class ShopError(Exception):
    """Base class of the errors the shop's external systems raise."""


class OutOfStock(ShopError):
    """The warehouse cannot reserve the ordered quantity."""


class GatewayTimeout(ShopError):
    """The payment gateway did not answer in time; a later attempt may succeed."""


class LedgerUnavailable(ShopError):
    """The accounting API is down for the moment; a later attempt may succeed."""


class AddressRejected(ShopError):
    """The mail server refused the recipient."""

    # RetryPolicy.non_retryable matches this code as well as the class.
    code = "address_rejected"


def _call(system: str, order_id: int) -> None:
    logger.debug("call system=%s order=%s", system, order_id)
    time.sleep(CALL_SECONDS)


def reserve_stock(order_id: int, sku: str, quantity: int) -> str:
    """Reserve ``quantity`` of ``sku`` for the order; return the reservation id."""
    _call("warehouse", order_id)
    if order_id % 37 == 0:
        raise OutOfStock(f"{sku} is out of stock ({quantity} wanted for order {order_id})")
    return f"rsv-{order_id}"


def charge(order_id: int, amount_cents: int, *, attempt: int) -> str:
    """Capture the order's payment; return the charge id."""
    _call("payments", order_id)
    if order_id % 11 == 0 and attempt <= 2:
        raise GatewayTimeout(f"payment gateway timed out charging order {order_id}")
    return f"ch-{order_id}-{amount_cents}"


def send_mail(to: str, subject: str, *, order_id: int) -> str:
    """Send one e-mail; return the message id."""
    _call("mail", order_id)
    if order_id % 47 == 0:
        raise AddressRejected(f"550 mailbox unavailable: {to}")
    return f"<receipt-{order_id}@shop.example>"


def post_ledger_entry(order_id: int, amount_cents: int, *, attempt: int) -> str:
    """Book the order's revenue in the accounting system; return the entry id."""
    _call("ledger", order_id)
    if order_id % 5 == 0 and attempt == 1:
        raise LedgerUnavailable("ledger API answered 503 Service Unavailable")
    return f"je-{order_id}"
