"""Events on the admin's run page: what a waiting run waits for, its events, and the
form that sends one (change permission, LogEntry), hostile rows escaped."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_jobs import send_event, start
from django_jobs.models import JobEvent, JobRun, Status
from django_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def client_with(*codenames: str) -> Client:
    user = User.objects.create_user(f"u-{'-'.join(codenames)}", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def page(run: JobRun) -> str:
    return reverse("admin:django_jobs_jobrun_change", args=[run.pk])


def send_url(run: JobRun) -> str:
    return reverse("admin:django_jobs_jobrun_send_event", args=[run.pk])


def test_the_page_says_what_the_run_waits_for_and_lists_its_events() -> None:
    run = start("tests.approval", {"count": 2})
    send_event(run, "approved", {"by": "ann"})
    drain()
    send_event(run, "other", "kept")
    html = client_with("view_jobrun").get(page(run)).content.decode()
    assert "the event approved, since" in html
    assert "no deadline" in html
    assert "by event:approved" in html  # the first event, taken by the first wait
    assert "kept: no wait has taken it yet" in html
    assert "Send event" not in html  # the viewer may not send


def test_hostile_names_and_payloads_are_escaped() -> None:
    run = start("tests.approval")
    drain()
    # Written by hand, past send_event's checks.
    JobEvent.objects.create(run=run, name="<b>x</b>", payload={"<script>": "alert(1)" * 200})
    html = client_with("view_jobrun").get(page(run)).content.decode()
    assert "<script>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html


def test_a_user_with_the_change_permission_sends_an_event_recorded_in_the_history() -> None:
    run = start("tests.approval")
    drain()
    client = client_with("view_jobrun", "change_jobrun")
    assert "Send event" in client.get(page(run)).content.decode()
    response = client.post(send_url(run), {"name": "approved", "payload": '{"ok": true}'})
    assert response.status_code == 302
    assert JobRun.objects.get(pk=run.pk).status == Status.PENDING
    assert JobEvent.objects.get(run=run).payload == {"ok": True}
    entry = LogEntry.objects.get(object_id=str(run.pk))
    assert entry.change_message == "Sent event 'approved' via the admin"
    drain()
    assert JobRun.objects.get(pk=run.pk).output == [{"ok": True}]


@pytest.mark.parametrize(
    ("name", "payload", "said"),
    [
        ("approved", "{not json", "Not a payload that can be sent"),
        ("has space", "", "no whitespace"),
        ("approved", "[" * 100 + "]" * 100, "Not a payload that can be sent"),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(name: str, payload: str, said: str) -> None:
    run = start("tests.approval")
    drain()
    client = client_with("view_jobrun", "change_jobrun")
    response = client.post(send_url(run), {"name": name, "payload": payload})
    assert response.status_code == 200
    assert said in response.content.decode()
    assert not JobEvent.objects.exists()


def test_a_finished_run_takes_no_event_and_a_viewer_cannot_send() -> None:
    done = start("tests.noop")
    drain()
    client = client_with("view_jobrun", "change_jobrun")
    response = client.post(send_url(done), {"name": "approved", "payload": ""})
    assert "has finished" in response.content.decode()
    assert not JobEvent.objects.exists()
    waiting = start("tests.approval")
    drain()
    viewer = client_with("view_jobrun")
    assert viewer.post(send_url(waiting), {"name": "approved"}).status_code == 403
    assert viewer.get(send_url(waiting)).status_code == 403
    assert client.get(send_url(waiting).replace(str(waiting.pk), "x1")).status_code == 404
    assert not JobEvent.objects.exists()
