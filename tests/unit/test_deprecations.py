"""Names that were renamed keep working, with a DeprecationWarning that names the new one."""

from __future__ import annotations

import pytest

from django_jobs import models


def test_the_former_name_of_the_finished_statuses_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="FINISHED_STATUSES"):
        former = models.TERMINAL_STATUSES  # type: ignore[attr-defined]
    assert former == frozenset(models.FINISHED_STATUSES)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NOT_A_STATUS_SET"):
        models.NOT_A_STATUS_SET  # type: ignore[attr-defined]  # noqa: B018
