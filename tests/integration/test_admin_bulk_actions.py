"""Bulk actions of the admin confirmed over selections larger than a page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from django_jobs.models import JobRun, Status
from tests.factories import JobRunFactory
from tests.helpers import operator

CHANGELIST = reverse("admin:django_jobs_jobrun_changelist")


def confirmation_form(html: str) -> dict[str, Any]:
    """The fields the confirmation page's form posts back, as a browser would send them."""
    form = html[html.index('<form method="post">') :]
    form = form[: form.index("</form>")]
    data: dict[str, Any] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        if name == "csrfmiddlewaretoken":
            continue
        data.setdefault(name, []).append(value)
    return data


@pytest.mark.django_db
def test_confirming_a_bulk_action_on_more_than_100_selected_runs_applies_to_all() -> None:
    # "Show all" lists up to list_max_show_all (200) runs on one page; the operator
    # ticks them all (no select_across needed, they are all on the page).
    runs = JobRunFactory.create_batch(150, status=Status.FAILED)
    client = operator()
    data = {"action": "retry_runs", "_selected_action": [r.pk for r in runs], "index": 0}
    confirm = client.post(CHANGELIST + "?all=", data)
    assert b"are you sure" in confirm.content
    assert b"Retry 150 runs" in confirm.content
    client.post(CHANGELIST + "?all=", confirmation_form(confirm.content.decode()))
    assert JobRun.objects.filter(status=Status.PENDING).count() == 150


@pytest.mark.django_db
def test_confirming_select_all_across_pages_applies_to_the_whole_filtered_set() -> None:
    runs = JobRunFactory.create_batch(120, status=Status.FAILED)
    JobRunFactory(status=Status.CANCELED)  # filtered out: must stay canceled
    client = operator()
    url = CHANGELIST + "?status__exact=failed"
    # The page shows 50; the operator ticks them, then "Select all 120" (select_across=1).
    data = {
        "action": "retry_runs",
        "_selected_action": [r.pk for r in runs[-50:]],
        "select_across": "1",
        "index": 0,
    }
    confirm = client.post(url, data)
    assert b"Retry 120 runs" in confirm.content
    done = client.post(url, confirmation_form(confirm.content.decode()), follow=True)
    assert JobRun.objects.filter(status=Status.PENDING).count() == 120, [
        str(m) for m in done.context["messages"]
    ]
    assert JobRun.objects.filter(status=Status.CANCELED).count() == 1
