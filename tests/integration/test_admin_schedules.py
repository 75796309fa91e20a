"""The schedules admin: run-time schedules added, changed, paused and deleted; code ones
read-only (but pausable); permissions, the history, hostile rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_jobs import Schedule, add_schedule, job, pause_schedule
from django_jobs.models import JobSchedule
from django_jobs.registry import unregister
from django_jobs.scheduler import run_schedules

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_jobschedule_changelist")
ADD = reverse("admin:django_jobs_jobschedule_add")
EVIL = "<script>alert(1)</script>"


def change_url(name: str) -> str:
    return reverse("admin:django_jobs_jobschedule_change", args=[quote(name)])


def delete_url(name: str) -> str:
    return reverse("admin:django_jobs_jobschedule_delete", args=[quote(name)])


def user_with(*codenames: str) -> Client:
    user = User.objects.create_user(f"u-{'-'.join(codenames) or 'none'}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def editor() -> Client:
    return user_with(
        "view_jobschedule", "add_jobschedule", "change_jobschedule", "delete_jobschedule"
    )


@pytest.fixture
def pauser() -> Client:
    return user_with("view_jobschedule", "pause_jobschedule")


@pytest.fixture
def viewer() -> Client:
    return user_with("view_jobschedule")


@pytest.fixture
def coded() -> Iterator[str]:
    """A schedule declared in code, with its row."""
    job("admin.coded", schedule=Schedule("0 3 * * *", timezone="Europe/Paris"))(lambda ctx: 1)
    run_schedules()
    yield "admin.coded"
    unregister("admin.coded")


def form(**values: Any) -> dict[str, Any]:
    return {
        "name": "admin.nightly",
        "job_type": "tests.noop",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "missed": "skip",
        "input": '{"report": "sales"}',
        **values,
    }


def history(name: str) -> list[tuple[int, str]]:
    entries = LogEntry.objects.filter(object_id=name).order_by("pk")
    return [(entry.action_flag, entry.get_change_message()) for entry in entries]


def action(client: Client, name: str, names: list[str], **extra: str) -> Any:
    data = {"action": name, "_selected_action": names, "index": 0, **extra}
    return client.post(CHANGELIST, data, follow=True)


# --- the pages ----------------------------------------------------------------------


def test_the_list_tells_code_from_run_time_and_paused(coded: str, viewer: Client) -> None:
    add_schedule("admin.runtime", "tests.noop", "@hourly")
    pause_schedule("admin.runtime")
    JobSchedule.objects.create(
        name="admin.gone", job_type="admin.gone", cron="@daily", timezone="UTC", missed="skip"
    )
    page = viewer.get(CHANGELIST)
    assert page.status_code == 200
    text = page.content.decode()
    for shown in ("admin.coded", "Europe/Paris", "admin.runtime", "run time", "paused since"):
        assert shown in text
    assert "code, no longer declared" in text
    paused = viewer.get(CHANGELIST, {"paused": "yes"}).content.decode()
    assert "admin.runtime" in paused
    assert "admin.coded" not in paused
    runtime_only = viewer.get(CHANGELIST, {"source__exact": "runtime"}).content.decode()
    assert "admin.gone" not in runtime_only
    assert ADD not in text  # a viewer adds nothing


def test_a_code_schedule_is_read_only_even_for_a_superuser(
    coded: str, admin_client: Client
) -> None:
    page = admin_client.get(change_url(coded))
    assert page.status_code == 200
    text = page.content.decode()
    assert 'name="cron"' not in text
    assert 'name="_save"' not in text
    assert delete_url(coded) not in text
    assert admin_client.post(change_url(coded), form(cron="@hourly")).status_code == 403
    assert admin_client.post(delete_url(coded), {"post": "yes"}).status_code == 403
    assert JobSchedule.objects.get(name=coded).cron == "0 3 * * *"
    assert not LogEntry.objects.exists()


# --- add, change, delete ------------------------------------------------------------


def test_an_editor_adds_a_schedule_recorded_once(editor: Client) -> None:
    page = editor.get(ADD)
    assert page.status_code == 200
    assert 'value="UTC"' in page.content.decode()  # settings.TIME_ZONE
    response = editor.post(ADD, form(paused="on"))
    assert response.status_code == 302, response.content.decode()[:3000]
    row = JobSchedule.objects.get()
    assert (row.name, row.source, row.input, row.paused, row.revision) == (
        "admin.nightly",
        "runtime",
        {"report": "sales"},
        True,
        1,
    )
    assert history("admin.nightly") == [(ADDITION, "Added.")]
    entry = LogEntry.objects.get()
    assert entry.user.username.startswith("u-view_jobschedule")


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"cron": "0 25 * * *"}, "cron", "hour 25 is out of range"),
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({"job_type": "tests.nope"}, "job_type", "no job is registered as"),
        ({"name": "with space"}, "name", "whitespace or a control character"),
        ({"name": "admin.coded"}, "name", "taken by a schedule declared in code"),
        ({"input": "{not json"}, "input", "Enter a valid JSON."),
        ({"input": "[" * 100_000}, "input", "nests too deeply"),
        ({"input": "[" * 40 + "]" * 40}, "input", "more than 31 deep"),
        ({"missed": "always"}, "missed", "Select a valid choice"),
    ],
)
def test_the_add_form_refuses_what_the_api_refuses(
    coded: str, editor: Client, values: dict[str, str], field: str, message: str
) -> None:
    response = editor.post(ADD, form(**values))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors.get(field, [])), errors
    assert not JobSchedule.objects.filter(source="runtime").exists()
    assert not LogEntry.objects.exists()


def test_a_taken_name_is_refused_by_the_form(editor: Client) -> None:
    add_schedule("admin.nightly", "tests.noop", "@daily")
    response = editor.post(ADD, form())
    assert "exists already" in " ".join(response.context["adminform"].form.errors["name"])
    assert JobSchedule.objects.get().cron == "@daily"


def test_an_editor_changes_a_schedule_recorded_once(editor: Client) -> None:
    add_schedule("admin.nightly", "tests.noop", "0 3 * * *", input={"report": "sales"})
    page = editor.get(change_url("admin.nightly")).content.decode()
    assert 'name="name"' not in page  # a new name is a new schedule: delete and add
    response = editor.post(change_url("admin.nightly"), form(cron="0 4 * * *", missed="catch_up"))
    assert response.status_code == 302, response.content.decode()[:3000]
    row = JobSchedule.objects.get()
    assert (row.cron, row.missed, row.input, row.revision) == (
        "0 4 * * *",
        "catch_up",
        {"report": "sales"},
        2,
    )
    assert row.last_tick is not None  # a new cron counts from now
    assert history("admin.nightly") == [(CHANGE, "Changed cron and missed.")]
    # Saved unchanged: nothing changes, nothing is recorded.
    editor.post(change_url("admin.nightly"), form(cron="0 4 * * *", missed="catch_up"))
    assert JobSchedule.objects.get().revision == 2
    assert len(history("admin.nightly")) == 1


def test_an_editor_deletes_a_schedule_recorded_once(editor: Client) -> None:
    add_schedule("admin.nightly", "tests.noop", "@daily")
    assert b"Are you sure" in editor.get(delete_url("admin.nightly")).content
    assert editor.post(delete_url("admin.nightly"), {"post": "yes"}).status_code == 302
    assert not JobSchedule.objects.exists()
    assert history("admin.nightly") == [(DELETION, "")]


def test_bulk_delete_takes_run_time_schedules_and_refuses_code_ones(
    coded: str, editor: Client
) -> None:
    add_schedule("admin.one", "tests.noop", "@daily")
    add_schedule("admin.two", "tests.noop", "@daily")
    action(editor, "delete_selected", ["admin.one", "admin.two"], post="yes")
    assert list(JobSchedule.objects.values_list("name", flat=True)) == [coded]
    assert [flag for flag, _ in history("admin.one") + history("admin.two")] == [DELETION] * 2
    refused = action(editor, "delete_selected", [coded], post="yes")
    assert refused.status_code == 403
    assert JobSchedule.objects.filter(name=coded).exists()


def test_permissions_are_the_models(viewer: Client, editor: Client) -> None:
    add_schedule("admin.nightly", "tests.noop", "@daily")
    assert viewer.get(ADD).status_code == 403
    assert viewer.post(ADD, form(name="admin.other")).status_code == 403
    assert viewer.post(change_url("admin.nightly"), form(cron="@hourly")).status_code == 403
    assert viewer.post(delete_url("admin.nightly"), {"post": "yes"}).status_code == 403
    assert 'name="cron"' not in viewer.get(change_url("admin.nightly")).content.decode()
    adder = user_with("view_jobschedule", "add_jobschedule")
    assert adder.post(change_url("admin.nightly"), form(cron="@hourly")).status_code == 403
    assert adder.post(ADD, form(name="admin.other")).status_code == 302
    assert JobSchedule.objects.get(name="admin.nightly").cron == "@daily"


# --- pause and resume ---------------------------------------------------------------


def test_pause_and_resume_ask_then_act_and_are_recorded(coded: str, pauser: Client) -> None:
    add_schedule("admin.catch_up", "tests.noop", "0 * * * *", missed="catch_up")
    confirm = action(pauser, "pause_schedules", [coded, "admin.catch_up"])
    assert b"are you sure" in confirm.content
    assert not JobSchedule.objects.filter(paused_at__isnull=False).exists()
    done = action(pauser, "pause_schedules", [coded, "admin.catch_up"], confirm="yes")
    assert "Paused 2 schedules, 0 skipped" in done.content.decode()
    assert JobSchedule.objects.filter(paused_at__isnull=False).count() == 2
    assert history(coded) == [(CHANGE, "Paused.")]  # a code schedule may be paused
    # Three hours paused: resuming says what happens to the ticks missed.
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    JobSchedule.objects.filter(name="admin.catch_up").update(
        created_at=hour - timedelta(days=1), last_tick=hour - timedelta(hours=3)
    )
    preview = action(pauser, "resume_schedules", ["admin.catch_up"]).content.decode()
    assert "3 run(s) start for ticks missed, 0 missed tick(s) are skipped" in preview
    action(pauser, "resume_schedules", [coded, "admin.catch_up"], confirm="yes")
    assert not JobSchedule.objects.filter(paused_at__isnull=False).exists()
    assert history("admin.catch_up") == [(CHANGE, "Paused."), (CHANGE, "Resumed.")]
    again = action(pauser, "resume_schedules", [coded], confirm="yes").content.decode()
    assert "Resumed 0 schedules, 1 skipped (not paused)" in again


def test_pausing_needs_its_permission(editor: Client) -> None:
    add_schedule("admin.nightly", "tests.noop", "@daily")
    assert "pause_schedules" not in editor.get(CHANGELIST).content.decode()
    action(editor, "pause_schedules", ["admin.nightly"], confirm="yes")
    assert not JobSchedule.objects.get().paused
    assert not LogEntry.objects.exists()


# --- hostile rows -------------------------------------------------------------------


def test_hostile_rows_are_escaped_and_cut(admin_client: Client) -> None:
    add_schedule(EVIL, "tests.noop", "@daily", input={EVIL: [EVIL * 40_000]})
    # Written some other way: what no API call would store.
    JobSchedule.objects.create(
        name="admin.worst",
        source="runtime",
        job_type=EVIL,
        cron=EVIL * 100_000,
        timezone=EVIL,
        missed=EVIL[:16],
        input={EVIL: [EVIL] * 100_000},
    )
    for url in (CHANGELIST, change_url(EVIL), change_url("admin.worst"), ADD):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert b"<script>alert" not in response.content, url
        assert len(response.content) < 500_000, (url, len(response.content))
    # The worst row's cron and input are shown cut, not offered for editing.
    worst = admin_client.get(change_url("admin.worst")).content.decode()
    assert 'name="cron"' not in worst
    assert 'name="input"' not in worst
    preview = action(admin_client, "resume_schedules", ["admin.worst"]).content
    assert b"<script>alert" not in preview
