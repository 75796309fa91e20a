"""Hostile schedule rows and requests (issue 32): a row holding what no API call
stores fails alone, with one log line, and every admin page and form answers
4xx or a form error for bad input; the workers' reread and the schedule list
never load inputs, and a tick loads only its own row's, bounded."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobs import Schedule, add_schedule, job, pause_schedule, resume_schedule
from django_jobs.models import JobRun, JobSchedule
from django_jobs.registry import unregister
from django_jobs.scheduler import Scheduler, run_schedules
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:django_jobs_jobschedule_changelist")
ADD = reverse("admin:django_jobs_jobschedule_add")
EVIL = "<script>alert(1)</script>\x1b[2J\u202e"
GOOD = ["ops.good-1", "ops.good-2", "ops.good-3"]
HOSTILE = "ops.hostile"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def table() -> str:
    return connection.ops.quote_name(JobSchedule._meta.db_table)


def store_input_text(name: str, text: str) -> None:
    """Write ``text`` as the stored input of ``name``, as SQL could: what no API call stores."""
    column = connection.ops.quote_name("input")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table()} SET {column} = %s WHERE name = %s", [text, name])
    except DatabaseError as exc:
        pytest.skip(f"{connection.vendor} cannot store this input: {exc}")


def ticks(name: str) -> list[datetime]:
    runs = JobRun.objects.filter(trigger_ref=name).order_by("run_at")
    return list(runs.values_list("run_at", flat=True))


@dataclass(frozen=True)
class Hostile:
    """A run-time schedule row as SQL could leave it, and whether it still fires."""

    changes: dict[str, Any] = field(default_factory=dict)
    input_text: str | None = None
    fires: bool = False
    name: str = HOSTILE


HOSTILE_ROWS = {
    "input nested 10,000 deep": Hostile(input_text="[" * 10_000 + "]" * 10_000),
    "input a number of 5,000 digits": Hostile(input_text="1" * 5_000),
    "input of 4 MB": Hostile(input_text='"' + "x" * 4_000_000 + '"'),
    "input a task cannot take": Hostile({"job_type": tasks.add.module_path, "input": "x"}),
    "input a string, for a job": Hostile({"input": "just text"}, fires=True),
    "input null": Hostile({"input": None}, fires=True),
    "cron markup": Hostile({"cron": EVIL}),
    "cron of 1 MB": Hostile({"cron": "* " * 500_000}),
    "cron that never fires": Hostile({"cron": "0 0 30 2 *"}),
    "cron with a 5,000-digit number": Hostile({"cron": "0" * 5_000 + " * * * *"}),
    "timezone unknown": Hostile({"timezone": "Mars/Olympus"}),
    "timezone a path": Hostile({"timezone": "../../../../etc/passwd"}),
    "timezone empty": Hostile({"timezone": ""}, fires=True),  # settings.TIME_ZONE
    "missed unknown": Hostile({"missed": "always"}),
    "job type unknown": Hostile({"job_type": "os.system"}),
    "job type markup": Hostile({"job_type": EVIL}),
    "last tick in year 9999": Hostile({"last_tick": utc(9999, 12, 31, 23, 59)}),
    "created in year 9999": Hostile({"created_at": utc(9999, 12, 31, 23, 59)}),
    "last tick in year 1": Hostile(
        {"last_tick": utc(1, 1, 2), "created_at": utc(1, 1, 1, 12)}, fires=True
    ),
    "paused in year 1": Hostile({"paused_at": utc(1, 1, 2)}),
    "revision at the integer's end": Hostile({"revision": 2**31 - 1}, fires=True),
    "revision negative": Hostile({"revision": -(2**31)}, fires=True),
    "source unknown": Hostile({"source": "evil"}),
    "name markup": Hostile(name=(EVIL + "é" * 200)[:200], fires=True),
}


def make_hostile(hostile: Hostile) -> None:
    add_schedule(HOSTILE, "tests.noop", "* * * * *", timezone="UTC")
    JobSchedule.objects.filter(name=HOSTILE).update(
        name=hostile.name, created_at=utc(2026, 1, 1, 10)
    )
    if hostile.changes:
        JobSchedule.objects.filter(name=hostile.name).update(**hostile.changes)
    if hostile.input_text is not None:
        store_input_text(hostile.name, hostile.input_text)


@pytest.mark.parametrize("hostile", HOSTILE_ROWS.values(), ids=HOSTILE_ROWS.keys())
def test_a_hostile_row_fails_alone_with_one_log_line(
    hostile: Hostile, caplog: pytest.LogCaptureFixture
) -> None:
    for name in GOOD:
        add_schedule(name, "tests.noop", "* * * * *", timezone="UTC")
    JobSchedule.objects.filter(name__in=GOOD).update(created_at=utc(2026, 1, 1, 10))
    make_hostile(hostile)
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    scheduler = Scheduler(["default"], threading.Event(), clock=clock)
    with caplog.at_level(logging.DEBUG, logger="django_jobs"):
        scheduler.step()
        for minute in (1, 2, 3):
            clock.now = utc(2026, 1, 1, 10, minute, 1)
            scheduler.step()
    for name in GOOD:
        assert ticks(name) == [utc(2026, 1, 1, 10, m) for m in (1, 2, 3)], name
    assert bool(ticks(hostile.name)) is hostile.fires
    said = [
        r for r in caplog.records if r.levelno >= logging.WARNING and hostile.name in r.getMessage()
    ]
    assert len(said) <= 1, [r.getMessage()[:300] for r in said]
    assert all(len(r.getMessage()) < 2_000 for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]


CODE_ROWS = {
    "last tick in year 9999": {"last_tick": utc(9999, 12, 31, 23, 59)},
    "created in year 9999": {"created_at": utc(9999, 12, 31, 23, 59)},
    "cron of 1 MB": {"cron": "* " * 500_000},
    "source unknown": {"source": "evil"},
    "revision at the integer's end": {"revision": 2**31 - 1},
}


@pytest.mark.parametrize("changes", CODE_ROWS.values(), ids=CODE_ROWS.keys())
def test_a_code_schedules_hostile_row_stops_no_other(
    changes: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    job("ops.coded", schedule=Schedule("* * * * *", timezone="UTC"))(lambda ctx: None)
    try:
        add_schedule("ops.good", "tests.noop", "* * * * *", timezone="UTC")
        run_schedules(utc(2026, 1, 1, 10))  # the code schedule's row
        JobSchedule.objects.update(created_at=utc(2026, 1, 1, 10))
        clock = Clock(utc(2026, 1, 1, 10, 0, 30))
        scheduler = Scheduler(["default"], threading.Event(), clock=clock)
        scheduler.step()
        JobSchedule.objects.filter(name="ops.coded").update(**changes)
        with caplog.at_level(logging.WARNING, logger="django_jobs"):
            for minute in (1, 2, 3):
                clock.now = utc(2026, 1, 1, 10, minute, 1)
                scheduler.step()
    finally:
        unregister("ops.coded")
    assert ticks("ops.good") == [utc(2026, 1, 1, 10, m) for m in (1, 2, 3)]
    said = [r.getMessage()[:300] for r in caplog.records if "ops.coded" in r.getMessage()]
    assert len(said) <= 1, said


@pytest.mark.parametrize("hostile", HOSTILE_ROWS.values(), ids=HOSTILE_ROWS.keys())
def test_a_hostile_row_breaks_no_page(
    hostile: Hostile, admin_client: Client, settings: Any
) -> None:
    settings.TIME_ZONE = "Europe/Paris"  # year 9999 in UTC is year 10000 here
    add_schedule("ops.good", "tests.noop", "@daily")
    make_hostile(hostile)
    key = quote(hostile.name)
    pages = [
        CHANGELIST,
        f"{CHANGELIST}?q=ops",
        reverse("admin:django_jobs_jobschedule_change", args=[key]),
        reverse("admin:django_jobs_jobschedule_delete", args=[key]),
        reverse("admin:django_jobs_jobschedule_history", args=[key]),
    ]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert b"<script>alert" not in response.content, url
        assert len(response.content) < 500_000, (url, len(response.content))
    for action in ("pause_schedules", "resume_schedules"):
        data = {"action": action, "_selected_action": [hostile.name, "ops.good"], "index": 0}
        asked = admin_client.post(CHANGELIST, data)
        assert asked.status_code == 200, action
        assert b"<script>alert" not in asked.content
        done = admin_client.post(CHANGELIST, {**data, "confirm": "yes"})
        assert done.status_code == 302, action
    # A change saved on the page: a form error at worst, never a crash.
    change = reverse("admin:django_jobs_jobschedule_change", args=[key])
    saved = admin_client.post(
        change, {"job_type": "tests.noop", "cron": "@hourly", "timezone": "UTC", "missed": "skip"}
    )
    assert saved.status_code in (200, 302, 403)
    deleted = admin_client.post(
        reverse("admin:django_jobs_jobschedule_delete", args=[key]), {"post": "yes"}
    )
    assert deleted.status_code == 302
    assert not JobSchedule.objects.filter(name=hostile.name).exists()


# --- requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "%00/change/",
        "%00/delete/",
        "%00/history/",
        "a%00b/change/",
        "x" * 5_000 + "/change/",
    ],
)
def test_a_schedule_url_that_names_no_possible_schedule_is_404(
    path: str, admin_client: Client
) -> None:
    add_schedule("ops.good", "tests.noop", "@daily")
    assert admin_client.get(CHANGELIST + path).status_code == 404
    assert admin_client.post(CHANGELIST + path, {"post": "yes"}).status_code == 404
    assert JobSchedule.objects.filter(name="ops.good").exists()


@pytest.mark.parametrize(
    "query",
    [
        {"q": "\x00"},
        {"q": "x" * 100_000},
        {"source__exact": "\x00"},
        {"missed__exact": "\x00"},
        {"paused": "\x00"},
        {"o": "\x00"},
        {"o": "9" * 5_000},
        {"p": "9" * 5_000},
        {"\x00": "x"},
    ],
)
def test_the_list_answers_bad_queries_without_a_crash(
    query: dict[str, str], admin_client: Client
) -> None:
    add_schedule("ops.good", "tests.noop", "@daily")
    response = admin_client.get(CHANGELIST, query)
    assert response.status_code < 500
    if "\x00" in "".join([*query, *query.values()]):
        assert response.status_code == 400


@pytest.mark.parametrize("selected", [["\x00"], ["ops.good", "a\x00"], ["x" * 5_000]])
def test_an_action_on_a_name_no_schedule_can_have_is_refused(
    selected: list[str], admin_client: Client
) -> None:
    add_schedule("ops.good", "tests.noop", "@daily")
    for extra in ({}, {"confirm": "yes"}, {"post": "yes"}):
        for action in ("pause_schedules", "delete_selected"):
            data = {"action": action, "_selected_action": selected, "index": 0, **extra}
            assert admin_client.post(CHANGELIST, data).status_code < 500
    assert JobSchedule.objects.get(name="ops.good").paused_at is None


FORM = {
    "name": "ops.new",
    "job_type": "tests.noop",
    "cron": "0 3 * * *",
    "timezone": "UTC",
    "missed": "skip",
    "input": "{}",
}


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"input": "1" * 5_000}, "input"),
        ({"input": '{"n": ' + "9" * 5_000 + "}"}, "input"),
        ({"input": '"\\ud800"'}, "input"),
        ({"input": '{"\\udfff": 1}'}, "input"),
        ({"input": "1e999"}, "input"),
        ({"input": '"\\u0000"'}, "input"),
        ({"input": "[" * 10_000 + "]" * 10_000}, "input"),
        ({"input": "\x00"}, "input"),
        ({"name": "\x00"}, "name"),
        ({"name": "x" * 5_000}, "name"),
        ({"cron": "0" * 5_000 + " * * * *"}, "cron"),
        ({"cron": "\x00"}, "cron"),
        ({"timezone": "\x00"}, "timezone"),
        ({"timezone": "x" * 5_000}, "timezone"),
        ({"timezone": "../../../../etc/passwd"}, "timezone"),
        ({"job_type": "\x00"}, "job_type"),
        ({"job_type": "x" * 5_000}, "job_type"),
        ({"missed": "\x00"}, "missed"),
    ],
)
def test_the_forms_answer_hostile_values_with_a_form_error(
    values: dict[str, str], field: str, admin_client: Client
) -> None:
    added = admin_client.post(ADD, {**FORM, **values})
    assert added.status_code == 200
    assert field in added.context["adminform"].form.errors
    assert not JobSchedule.objects.exists()
    if field == "name":
        return
    add_schedule("ops.old", "tests.noop", "@daily")
    change = reverse("admin:django_jobs_jobschedule_change", args=["ops.old"])
    changed = admin_client.post(change, {**FORM, **values})
    assert changed.status_code == 200
    assert field in changed.context["adminform"].form.errors
    assert JobSchedule.objects.get().revision == 1


# --- what is loaded ----------------------------------------------------------------------


def input_column() -> str:
    return f"{table()}.{connection.ops.quote_name('input')}"


def reads_input(sql: str) -> bool:
    """Whether ``sql`` reads the input column, whole or in part."""
    return sql.startswith("SELECT") and input_column() in sql


def selects_input(sql: str) -> bool:
    """Whether ``sql`` reads the whole input column (not a cut or a length of it)."""
    column = input_column()
    return column in sql.replace(f"CAST({column}", "").replace(f"({column})::", "")


def test_the_reread_and_the_list_load_no_input(admin_client: Client) -> None:
    for n in range(5):
        add_schedule(f"ops.big-{n}", "tests.noop", "* * * * *", input={"blob": "x" * 500_000})
    JobSchedule.objects.update(created_at=utc(2026, 1, 1, 10))
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    scheduler = Scheduler(["default"], threading.Event(), clock=clock)
    with CaptureQueriesContext(connection) as queries:
        scheduler.step()  # the first read: every row, nothing due
        change_schedule_of_one()
        clock.now = utc(2026, 1, 1, 10, 0, 40)
        scheduler.step()  # a reread: the changed row
    assert len(queries) >= 3
    assert not [q["sql"] for q in queries if reads_input(q["sql"])]
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(CHANGELIST).status_code == 200
    assert not [q["sql"][:300] for q in queries if reads_input(q["sql"])]

    # A tick reads the input of its own row only.
    clock.now = utc(2026, 1, 1, 10, 1, 1)
    with CaptureQueriesContext(connection) as queries:
        scheduler.step()
    assert len(ticks("ops.big-0")) == 1
    assert all(run.input == {"blob": "x" * 500_000} for run in JobRun.objects.all())
    reads = [q["sql"] for q in queries if reads_input(q["sql"])]
    assert len(reads) == 5  # one per row that fired, each of one row


def change_schedule_of_one() -> None:
    pause_schedule("ops.big-0")
    resume_schedule("ops.big-0")


def test_the_change_page_loads_a_bounded_cut_of_a_big_input(admin_client: Client) -> None:
    add_schedule("ops.big", "tests.noop", "@daily", input={"blob": "é" * 400_000})
    url = reverse("admin:django_jobs_jobschedule_change", args=["ops.big"])
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url)
    assert page.status_code == 200
    assert len(page.content) < 300_000
    text = page.content.decode()
    assert 'name="input"' not in text  # too big to edit in a form
    assert "truncated" in text
    assert not [q["sql"][:300] for q in queries if selects_input(q["sql"])]
    # Its other fields are changed without touching it.
    form = {"job_type": "tests.noop", "cron": "@hourly", "timezone": "UTC", "missed": "skip"}
    assert admin_client.post(url, form).status_code == 302
    row = JobSchedule.objects.get()
    assert (row.cron, row.input) == ("@hourly", {"blob": "é" * 400_000})


def test_a_small_input_is_still_edited_in_the_form(admin_client: Client) -> None:
    add_schedule("ops.small", "tests.noop", "@daily", input={"n": [1, 2]})
    url = reverse("admin:django_jobs_jobschedule_change", args=["ops.small"])
    page = admin_client.get(url).content.decode()
    assert 'name="input"' in page
    assert "{&quot;n&quot;: [1, 2]}" in page
    form = {**FORM, "input": '{"n": [3]}'}
    del form["name"]
    assert admin_client.post(url, form).status_code == 302
    assert JobSchedule.objects.get().input == {"n": [3]}


def test_a_big_input_is_a_download_behind_the_view_permission(
    admin_client: Client, client: Client
) -> None:
    add_schedule("ops.big", "tests.noop", "@daily", input={"blob": "x" * 100_000})
    url = reverse("admin:django_jobs_jobschedule_input", args=["ops.big"])
    change = reverse("admin:django_jobs_jobschedule_change", args=["ops.big"])
    assert url in admin_client.get(change).content.decode()
    response = admin_client.get(url)
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith("attachment;")
    assert b"x" * 100_000 in response.content
    assert admin_client.get(url.replace("ops.big", "ops.none")).status_code == 404
    assert admin_client.get(url.replace("ops.big", "%00")).status_code == 404
    assert client.get(url).status_code == 302  # to the login page


# --- every hostile row at once -------------------------------------------------------------


def make_every_hostile_row() -> list[str]:
    """One row per kind of ``HOSTILE_ROWS``, side by side; the names of those made
    (an input this database refuses to store is left out)."""
    made = []
    for n, hostile in enumerate(HOSTILE_ROWS.values()):
        name = f"ops.evil-{n}" if hostile.name == HOSTILE else hostile.name
        add_schedule(f"ops.evil-{n}", "tests.noop", "* * * * *", timezone="UTC")
        JobSchedule.objects.filter(name=f"ops.evil-{n}").update(
            name=name, created_at=utc(2026, 1, 1, 10)
        )
        if hostile.changes:
            JobSchedule.objects.filter(name=name).update(**hostile.changes)
        if hostile.input_text is not None:
            column = connection.ops.quote_name("input")
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    sql = f"UPDATE {table()} SET {column} = %s WHERE name = %s"
                    cursor.execute(sql, [hostile.input_text, name])
            except DatabaseError:
                JobSchedule.objects.filter(name=name).delete()
                continue
        made.append(name)
    return made


def test_every_hostile_row_at_once_stops_no_good_schedule(admin_client: Client) -> None:
    for name in GOOD:
        add_schedule(name, "tests.noop", "* * * * *", timezone="UTC")
    JobSchedule.objects.filter(name__in=GOOD).update(created_at=utc(2026, 1, 1, 10))
    made = make_every_hostile_row()
    assert len(made) >= len(HOSTILE_ROWS) - 2
    clock = Clock(utc(2026, 1, 1, 10, 0, 30))
    scheduler = Scheduler(["default"], threading.Event(), clock=clock)
    scheduler.step()
    for minute in (1, 2, 3):
        clock.now = utc(2026, 1, 1, 10, minute, 1)
        scheduler.step()
    for name in GOOD:
        assert ticks(name) == [utc(2026, 1, 1, 10, m) for m in (1, 2, 3)], name
    # And the list of them all is one page within budget.
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    assert b"<script>alert" not in response.content
    assert len(response.content) < 1_000_000
