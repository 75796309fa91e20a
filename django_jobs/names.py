"""Names an operator types and reads back: what makes a valid pool name (no database)."""

from __future__ import annotations

MAX_POOL_NAME = 100


def pool_problem(name: object) -> str | None:
    """Why ``name`` cannot be a pool name, or None.

    Whitespace and control characters are refused: ``"orders "`` would look
    like ``"orders"`` in every listing while being another pool, and a name
    that cannot be typed back cannot be paused or forgotten.
    """
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if len(name) > MAX_POOL_NAME:
        return f"is longer than {MAX_POOL_NAME} characters"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "contains whitespace or a control character"
    return None


# The most runs of one concurrency key that may run at once: a claim looks for a
# free slot among them.
MAX_CONCURRENCY_LIMIT = 1000


def concurrency_limit(limit: object) -> int:
    """``limit`` as a concurrency limit: an integer from 1 to ``MAX_CONCURRENCY_LIMIT``."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"concurrency_limit must be an integer, got {limit!r}")
    if not 1 <= limit <= MAX_CONCURRENCY_LIMIT:
        raise ValueError(
            f"concurrency_limit must be between 1 and {MAX_CONCURRENCY_LIMIT}, got {limit!r}"
        )
    return limit


MAX_EVENT_NAME = 200


def event_name(name: object) -> str:
    """``name`` as the name of an event (``send_event``, ``ctx.wait_for_event``); raises
    ``ValueError`` for anything else: a non-empty string of at most
    ``MAX_EVENT_NAME`` printable characters without whitespace or ``#`` (a
    wait's record is the step ``event:<name>``, and ``#`` numbers repeated steps)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an event name is a non-empty string, got {name!r}")
    if len(name) > MAX_EVENT_NAME:
        raise ValueError(f"an event name is at most {MAX_EVENT_NAME} characters, got {len(name)}")
    if any(c.isspace() or not c.isprintable() or c == "#" for c in name):
        raise ValueError(f"an event name has no whitespace, control character or '#': {name!r}")
    return name
