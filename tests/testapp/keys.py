"""Key functions that ``DJANGO_JOBS["JOB_OPTIONS"]`` names by dotted path in the tests."""

from __future__ import annotations

from typing import Any

from django.utils.functional import SimpleLazyObject


def by_account(input: Any) -> str:
    """A ``@job``'s key: given its input."""
    return f"account:{input['account']}"


def by_first_argument(first: Any, *args: Any, **kwargs: Any) -> str:
    """A task's key: given the task's arguments."""
    return f"first:{first}"


def shared(*args: Any, **kwargs: Any) -> str:
    return "shared"


not_callable = "a string"


def _fail() -> Any:
    raise RuntimeError("a lazy object was built")


# A module global that fails when built (a storage without its credentials):
# finding tasks must not build it.
lazily_failing = SimpleLazyObject(_fail)
