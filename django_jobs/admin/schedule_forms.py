"""The forms that add and change run-time schedules in the admin.

They check what they are given with ``schedule_api``'s own checks, so a form
refuses exactly what ``add_schedule()`` and ``change_schedule()`` refuse, each
error under its field; saving is the admin's, through the API.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from ..exceptions import InvalidSchedule
from ..models import JobSchedule
from ..schedule_api import FIELDS, Definition, check_definition, check_name
from ..schedule_rows import read_input
from ..schedules import MISSED_POLICIES


class InputField(forms.JSONField):
    """A JSON value, where text ``json`` cannot parse is an error, not a crash: nested
    past its recursion limit, or a number of more digits than Python converts (4,300)."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError(_("Input nests too deeply."), code="invalid") from None
        except ValueError:
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return forms.fields.InvalidJSONInput(data)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        text = json.dumps(value, ensure_ascii=False, cls=self.encoder)
        try:
            text.encode()
        except UnicodeEncodeError:
            # A lone surrogate ("\ud800" typed as JSON): written as its escape,
            # which the page can carry and the form then refuses again.
            text = json.dumps(value, cls=self.encoder)
        return text


class ScheduleForm(forms.ModelForm):  # type: ignore[type-arg]
    """A run-time schedule's definition; the admin gives it only the fields it may edit."""

    job_type = forms.CharField(
        label=_("job type"),
        max_length=200,
        help_text=_(
            "A job type registered with @job, or the module path of a django.tasks @task "
            "whose module is imported (from your app's jobs.py, for one)."
        ),
    )
    cron = forms.CharField(
        label=_("cron"),
        max_length=1000,
        help_text=_("Five fields (minute hour day-of-month month day-of-week) or @daily."),
    )
    timezone = forms.CharField(
        label=_("time zone"), max_length=100, help_text=_("An IANA name, such as Europe/Paris.")
    )
    missed = forms.ChoiceField(
        label=_("missed ticks"),
        choices=[
            (MISSED_POLICIES[0], _("skip: start nothing for ticks missed")),
            (MISSED_POLICIES[1], _("catch up: one run per tick missed, up to 100")),
        ],
    )
    input = InputField(
        label=_("input"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text=_(
            'JSON that every run gets ({} when empty); for a task, {"args": [...], '
            '"kwargs": {...}}.'
        ),
    )
    paused = forms.BooleanField(
        label=_("paused"), required=False, help_text=_("Add it paused: no run starts yet.")
    )

    class Meta:
        model = JobSchedule
        fields = ["name", *FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The admin lists the fields this form edits; declared fields are always
        # there otherwise, and a missing one would clear its value.
        for name, field in list(self.fields.items()):
            if name not in (self._meta.fields or ()):
                del self.fields[name]
            field.label = capfirst(field.label)  # as Django labels a model's fields
        if self.instance._state.adding and "timezone" in self.fields:
            self.fields["timezone"].initial = settings.TIME_ZONE or "UTC"
        self.definition: Definition | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            values = {field: self._value(data, field) for field in FIELDS}
            if self.instance._state.adding:
                check_name(data.get("name"))
            self.definition = check_definition(**values)
        except InvalidSchedule as exc:
            field = exc.field if exc.field in self.fields else None
            self.add_error(field, str(exc))
        return data

    def _value(self, data: dict[str, Any], field: str) -> Any:
        """What ``field`` will hold: as given, or as stored (an input not offered
        for editing is read as the API reads it, within ``MAX_INPUT_BYTES``)."""
        if field in self.fields:
            return data.get(field)
        if field != "input":
            return getattr(self.instance, field)
        try:
            return read_input(self.instance.name)
        except ValueError as exc:
            raise InvalidSchedule(
                f"{exc}: delete this schedule and add it again with an input", "input"
            ) from None

    def validate_unique(self) -> None:
        # The API says it (a taken name, in its words); the model's check would say it twice.
        return None
