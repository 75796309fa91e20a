"""What the admin accepts from a request: ids that are ids, parameters a query can use.

A crafted request is the requester's mistake, answered with a 400 (``BadRequest``),
never a server error: PostgreSQL cannot compare text with a NUL character at
all (the statement fails), and Django's own answer to a filter value of the
wrong shape is a redirect to a "Database error" page, which blames the database.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import BadRequest
from django.http import HttpRequest, QueryDict


def an_id(text: str) -> bool:
    """Whether ``text`` is a row id: ASCII digits, few enough for a bigint."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def run_of_page(model_admin: Any, request: HttpRequest, object_id: str) -> tuple[Any, str]:
    """The run a run-page view (a button's, a form's) is about, as this user may see
    it, and its page's URL; 404 for an id that is not one or a run not found."""
    from django.http import Http404
    from django.shortcuts import get_object_or_404
    from django.urls import reverse

    if not an_id(object_id):
        raise Http404("no such run")
    run = get_object_or_404(model_admin.get_queryset(request), pk=int(object_id))
    opts = model_admin.opts
    return run, reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[run.pk])


def check_query(query: QueryDict) -> None:
    """Refuse (400) a query string that no column could match: a NUL in a name or value."""
    for name, values in query.lists():
        if "\0" in name or any("\0" in value for value in values):
            raise BadRequest("a query parameter holds a NUL character")


class CheckedChangeList:
    """A ModelAdmin mixin: a changelist whose query string is bad answers 400."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        check_query(request.GET)
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            return super().get_changelist_instance(request)  # type: ignore[misc]
        except IncorrectLookupParameters as exc:
            # A filter value of the wrong shape (a date that is not one, a parent
            # that is not an id), or a page past the last.
            raise BadRequest(f"bad query parameters: {exc}") from exc
