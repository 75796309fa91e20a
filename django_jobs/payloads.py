"""JSON validation and normalisation of inputs, outputs and step outputs."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from . import conf
from .exceptions import InvalidJobInput

# How deeply lists and objects may nest in a stored value: far beyond what any
# job needs. The deepest MariaDB stores (its JSON columns refuse 32), and the
# same on every database, so that a job written against one runs on all.
MAX_DEPTH = 31

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def normalize(value: Any, *, what: str) -> Any:
    """Return ``value`` as the JSON it will be stored as, or raise ``InvalidJobInput``.

    The value goes through ``DjangoJSONEncoder`` once, so dates, decimals and UUIDs
    become strings and tuples become lists here, at enqueue, not differently at
    every attempt. ``what`` names the value in the error ("input", "step 'charge'").
    """
    if value is None:
        return None  # what most handlers return
    return json.loads(to_json(value, what=what))


def to_json(value: Any, *, what: str) -> str:
    """The JSON text ``value`` is stored as; ``InvalidJobInput`` when it cannot be stored."""
    try:
        text = json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False, ensure_ascii=False)
    except RecursionError:  # far deeper than MAX_DEPTH
        raise InvalidJobInput(f"{what} is nested too deeply to be stored as JSON") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJobInput(f"{what} is not JSON-serializable: {exc}") from None
    if _depth(text) > MAX_DEPTH:
        raise InvalidJobInput(f"{what} nests lists or objects more than {MAX_DEPTH} deep")
    # PostgreSQL's jsonb cannot hold a NUL character; say so here, not at INSERT.
    if "\\u0000" in text:
        raise InvalidJobInput(f"{what} contains a NUL character (\\u0000), which cannot be stored")
    limit = conf.get().MAX_INPUT_BYTES
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidJobInput(
            f"{what} contains text that is not valid Unicode (a lone surrogate)"
        ) from None
    if size > limit:
        raise InvalidJobInput(
            f"{what} is {size} bytes as JSON, more than MAX_INPUT_BYTES ({limit})"
        )
    return text


def _depth(text: str) -> int:
    """How deeply the JSON ``text`` nests lists and objects (0 when it has too
    few brackets to go deeper than ``MAX_DEPTH``)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def finite(value: Any) -> float | None:
    """A stored number as a finite float, or None for anything else (a row may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def is_control(char: str) -> bool:
    """Whether ``char`` is not text: a control, format or line-breaking character.

    ESC and BEL start the sequences that retitle, clear or recolour a terminal, a
    newline forges a line of output, a bidirectional override reorders what is
    shown. The spaces of every script (a no-break space, an ideographic space) are
    text: French typing puts a no-break space before a colon.
    """
    return not char.isprintable() and unicodedata.category(char) != "Zs"


def control_problem(text: str) -> str | None:
    """Why ``text`` cannot be a one-line note shown to operators (a pause or cancel
    reason), or None; the message names the first control character and where it is."""
    for position, char in enumerate(text):
        if is_control(char):
            return (
                f"contains a control character ({repr(char)[1:-1]} at position {position}); "
                "write it as one line of plain text"
            )
    return None


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape
    (``\\x1b``, ``\\u202e``): for command output that shows stored names and messages."""
    if text.isprintable():  # the common case, at C speed: nothing to escape
        return text
    return "".join(repr(c)[1:-1] if is_control(c) else c for c in text)


def printable(text: Any, limit: int = 1000) -> str:
    """Stored text made safe for a terminal: control characters become spaces."""
    if not isinstance(text, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in text[:limit])


# --- reading back what a row holds (for pages and commands) -------------------------


@dataclass(frozen=True)
class Unreadable:
    """Stands in for a stored JSON value that cannot be read back; says why.

    The database is trusted, yet a row may hold JSON Python cannot load (a
    number of more than 4,300 digits, nesting past the recursion limit) or, where
    a CHECK constraint was turned off, text that is not JSON at all. A page or a
    command shows this mark in its place and goes on with the other rows.
    """

    problem: str


def read_json(text: Any, *, limit: int | None = None) -> Any:
    """The value of a JSON column read as text (``Cast(column, TextField())``), or an
    ``Unreadable`` saying why it cannot be: longer than ``limit`` characters (the
    caller reads at most ``limit + 1``), not JSON, or JSON Python cannot hold.
    Never raises, whatever the text."""
    if text is None:
        return None
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        return Unreadable(f"read as {type(text).__name__}, not text")
    if limit is not None and len(text) > limit:
        return Unreadable(f"longer than {limit:,} characters")
    try:
        return json.loads(text)
    except RecursionError:
        return Unreadable("nested too deeply to read")
    except json.JSONDecodeError:
        return Unreadable("not JSON")
    except ValueError as exc:  # an integer past int_max_str_digits, in Python's words
        return Unreadable(str(exc).split(";")[0][:200])


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and an ellipsis when it is longer."""
    return text if len(text) <= limit else text[:limit] + "…"
