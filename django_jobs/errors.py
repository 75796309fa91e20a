"""How an exception is written down: the ``error`` record of a run or a step. No database.

An exception's text is as hostile as any payload (a 50 MB message would make a
100 MB run page), so a record is bounded: past ``MAX_ERROR_MESSAGE`` and
``MAX_TRACEBACK`` characters, the middle is cut and says how much.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

MAX_ERROR_MESSAGE = 10_000
MAX_TRACEBACK = 50_000


def error_record(error: BaseException, attempt: int | None, *, retryable: bool) -> dict[str, Any]:
    """Describe ``error`` for ``JobRun.error``: type, message, traceback, attempt.

    Never raises, and never returns text the database would refuse: an
    exception that cannot be printed is described as such.
    """
    cls = type(error)
    trace = safely(lambda: "".join(traceback.format_exception(error)), cls)
    return {
        "type": type_name(error),
        "message": storable(clip(message_of(error), MAX_ERROR_MESSAGE)),
        # A traceback's end names the failing line: keep both ends of a long one.
        "traceback": storable(clip(trace, MAX_TRACEBACK, tail=MAX_TRACEBACK * 4 // 5)),
        "attempt": attempt,
        "retryable": retryable,
    }


def type_name(error: BaseException) -> str:
    """The exception's class as a dotted path."""
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def message_of(error: BaseException) -> str:
    """``str(error)``, or a placeholder when the exception cannot be printed."""
    return safely(lambda: str(error), type(error))


def clip(text: str, limit: int, *, tail: int = 0) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out;
    the last ``tail`` of them are kept from its end."""
    if len(text) <= limit:
        return text
    head = limit - tail
    dropped = len(text) - head - tail
    return f"{text[:head]}\n… [{dropped:,} characters cut] …\n{text[len(text) - tail :]}"


def safely(render: Callable[[], str], cls: type) -> str:
    """``render()``, or a placeholder naming ``cls`` if rendering raised."""
    try:
        return render()
    except Exception:
        return f"<unprintable {cls.__name__}>"


def storable(text: str) -> str:
    """Text a jsonb column accepts: no NUL characters, no lone surrogates."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
