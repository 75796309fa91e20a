"""The models' fields named in the user's language, wherever the admin shows them.

The fields keep the verbose names Django derives from their names: a field's
``verbose_name`` is part of its migration state, so translating it there would
mean a migration. An admin names the fields it shows in ``field_labels``
instead, and this mixin puts those names in the list's column headers, the
list filters' titles and the labels of the object page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise


class FieldLabels:
    """A ModelAdmin mixin: ``field_labels`` maps field names to their (lazy) labels."""

    field_labels: Mapping[str, _StrOrPromise] = {}
    model: type[models.Model]

    def get_list_display(self, request: HttpRequest) -> Any:
        return [self._column(item) for item in super().get_list_display(request)]  # type: ignore[misc]

    def get_list_display_links(self, request: HttpRequest, list_display: Sequence[Any]) -> Any:
        links = super().get_list_display_links(request, list_display)  # type: ignore[misc]
        return None if links is None else [self._column(item) for item in links]

    def get_list_filter(self, request: HttpRequest) -> Any:
        return [
            (item, _titled(self.field_labels[item]))
            if isinstance(item, str) and item in self.field_labels
            else item
            for item in super().get_list_filter(request)  # type: ignore[misc]
        ]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        # The object page's read-only fields take their labels from the form's Meta.
        labels = {**self.field_labels, **kwargs.pop("labels", {})}
        return super().get_form(request, obj, change, labels=labels, **kwargs)  # type: ignore[misc]

    def _column(self, item: Any) -> Any:
        """A labelled column for a field's name; anything else as it is.

        The same callable for the same name, so that ``list_display_links``
        finds its columns in ``list_display``.
        """
        if not isinstance(item, str) or item not in self.field_labels:
            return item
        columns: dict[str, Callable[[Any], Any]] = self.__dict__.setdefault("_columns", {})
        if item not in columns:
            columns[item] = _field_column(self.model._meta.get_field(item), self.field_labels[item])
        return columns[item]


def _field_column(field: Any, label: _StrOrPromise) -> Callable[[Any], Any]:
    """A list column showing ``field`` as Django shows a field, under ``label``."""
    name = field.name

    @admin.display(description=label, ordering=name, boolean=isinstance(field, models.BooleanField))
    def column(obj: Any) -> Any:
        if field.choices:
            return getattr(obj, f"get_{name}_display")()
        return getattr(obj, field.attname)

    # The cells and the header keep the field's CSS classes (field-NAME, column-NAME).
    column.__name__ = name
    return column


def _titled(title: _StrOrPromise) -> Callable[..., admin.ListFilter]:
    """What ``list_filter`` takes to make a field's usual filter, under ``title``."""

    def create(
        field: Any, request: HttpRequest, params: Any, model: Any, model_admin: Any, field_path: str
    ) -> admin.ListFilter:
        spec = admin.FieldListFilter.create(
            field, request, params, model, model_admin, field_path=field_path
        )
        spec.title = title
        return spec

    return create
