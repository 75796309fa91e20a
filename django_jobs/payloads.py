"""JSON validation and normalisation of inputs, outputs and step outputs."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from . import conf
from .exceptions import InvalidJobInput


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
    except RecursionError:
        raise InvalidJobInput(f"{what} is nested too deeply to be stored as JSON") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJobInput(f"{what} is not JSON-serializable: {exc}") from None
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
