"""An error as the admin shows it, for a run and for a failed step alike.

Its type and message on one line, the attempt and whether another attempt
could cure it, and the traceback folded under a ``<details>``. Every value is
escaped and cut: a stored error is as much the caller's text as an input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from . import display


@dataclass(frozen=True)
class ShownError:
    """What the page shows of one stored error; ``*_size`` are the whole lengths."""

    type: str
    message: str
    message_size: int
    traceback: str
    traceback_size: int
    attempt: Any = None
    retryable: Any = None

    @classmethod
    def of(cls, error: Any) -> ShownError | None:
        """From a stored error (``JobRun.error``); None when it is not one."""
        if not isinstance(error, dict) or not error:
            return None
        message, trace = _text(error.get("message")), _text(error.get("traceback"))
        return cls(
            type=_text(error.get("type")),
            message=message,
            message_size=len(message),
            traceback=trace,
            traceback_size=len(trace),
            attempt=error.get("attempt"),
            retryable=error.get("retryable"),
        )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def not_retryable(value: Any) -> bool:
    """Whether a stored ``retryable`` says no (JSON false, or SQLite's 0 read as text)."""
    return value is False or value in (0, "0", "false")


def render(
    error: ShownError,
    *,
    whole: str | None,
    limit: int = display.SHOWN,
    traceback_open: bool = False,
) -> SafeString:
    """The error's line, then its traceback, folded unless ``traceback_open``.

    Past ``limit`` characters, the message and the traceback are cut with a
    note and the ``whole`` link (the error's download).
    """
    facts = []
    if error.attempt is not None:
        facts.append(gettext("attempt {number}").format(number=str(error.attempt)[:20]))
    if not_retryable(error.retryable):
        facts.append(gettext("not retryable"))
    note = ""
    if error.message_size > limit:
        note = display.truncated(error.message_size, whole, unit="characters")
    line = format_html(
        '<div class="dj-error"><strong>{}</strong>: {}{}</div>{}',
        error.type[:1000] or gettext("error"),
        error.message[:limit],
        format_html(" <small>({})</small>", ", ".join(facts)) if facts else "",
        note,
    )
    if not error.traceback:
        return line
    return format_html(
        '{}<details class="dj-traceback"{}><summary>{}</summary>{}</details>',
        line,
        " open" if traceback_open else "",
        gettext("traceback"),
        display.preformatted(error.traceback, whole=whole, limit=limit, size=_cut_size(error)),
    )


def _cut_size(error: ShownError) -> int | None:
    """The whole traceback's length when the text held is only its beginning."""
    return error.traceback_size if error.traceback_size > len(error.traceback) else None
