"""Hostile data (issue 16): deep payloads, huge progress numbers, tenants through parents."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_jobs import cancel, start
from django_jobs.admin import display
from django_jobs.errors import MAX_ERROR_MESSAGE, MAX_TRACEBACK
from django_jobs.exceptions import InvalidJobInput, RunNotFound
from django_jobs.models import JobRun, JobStep
from django_jobs.payloads import MAX_DEPTH
from django_jobs.testing import drain
from tests.factories import JobRunFactory
from tests.helpers import operator

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_jobrun_changelist")


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_480, 1_490, 100_000])
def test_an_input_nested_too_deeply_is_refused_at_enqueue(depth: int) -> None:
    with pytest.raises(InvalidJobInput, match="nest"):
        start("tests.noop", {"x": nested(depth)})
    assert not JobRun.objects.exists()


def test_an_input_at_the_depth_limit_is_stored_and_the_admin_shows_it(
    admin_client: Client,
) -> None:
    run = start("tests.noop", {"x": nested(MAX_DEPTH - 1)})
    for url in ("/admin/django_jobs/jobrun/", f"/admin/django_jobs/jobrun/{run.pk}/change/"):
        assert admin_client.get(url).status_code == 200


def test_the_run_list_does_not_load_payloads(admin_client: Client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    start("tests.noop", {"secret": "x" * 1000})
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get("/admin/django_jobs/jobrun/").status_code == 200
    table = connection.ops.quote_name("django_jobs_jobrun")
    listing = [q["sql"] for q in queries if f"FROM {table}" in q["sql"]]
    assert listing
    assert not any(f"{table}.{connection.ops.quote_name('input')}" in sql for sql in listing)


@pytest.mark.parametrize(
    ("done", "total"),
    [(0, 10**400), (10**400, None), (float("nan"), None), (1e16, None), (-1, None)],
)
def test_progress_beyond_a_sane_range_is_refused(done: Any, total: Any) -> None:
    from django_jobs.context import progress_record

    with pytest.raises(ValueError, match="set_progress"):
        progress_record(done, total, "")


def test_stored_hostile_progress_renders_in_the_admin_and_jobstatus(
    admin_client: Client,
) -> None:
    from io import StringIO

    from tests.factories import RunningJobRunFactory

    run = RunningJobRunFactory(
        progress={"done": 10**400, "total": "x", "message": "\x1b]0;owned\x07\x1b[2J", "at": 3}
    )
    for url in ("/admin/django_jobs/jobrun/", f"/admin/django_jobs/jobrun/{run.pk}/change/"):
        assert admin_client.get(url).status_code == 200
    out = StringIO()
    call_command("jobstatus", stdout=out)
    assert "\x1b" not in out.getvalue()
    assert "\x07" not in out.getvalue()


def test_a_progress_message_loses_its_control_characters() -> None:
    from django_jobs.context import progress_record

    record = progress_record(1, 2, "\x1b[1;31mFAKE: all pools healthy")
    assert record["message"] == " [1;31mFAKE: all pools healthy"


def test_a_child_belongs_to_its_parents_tenant_or_is_refused() -> None:
    acme = start("tests.noop", tenant_id="acme")
    with pytest.raises(RunNotFound) as other_tenant:
        start("tests.noop", tenant_id="globex", parent=acme.pk)
    with pytest.raises(RunNotFound) as missing:
        start("tests.noop", tenant_id="globex", parent=acme.pk + 1000)
    assert str(other_tenant.value) == f"no run with id {acme.pk}"
    assert str(missing.value) == f"no run with id {acme.pk + 1000}"
    inherited = start("tests.noop", parent=acme.pk)
    assert inherited.tenant_id == "acme"
    assert start("tests.noop", tenant_id="acme", parent=acme).tenant_id == "acme"
    assert JobRun.objects.filter(tenant_id="globex").count() == 0


def test_a_parent_that_is_not_an_id_is_refused() -> None:
    with pytest.raises(RunNotFound):
        start("tests.noop", parent="1; DROP TABLE x")  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("job_type", ["this.s", "antigravity.fly", "tests.testapp.tasks.Task"])
def test_a_forged_job_type_imports_nothing_outside_the_projects_tasks(job_type: str) -> None:
    import sys

    from django_jobs.testing import drain
    from tests.factories import JobRunFactory

    module = job_type.rpartition(".")[0]
    if module in ("this", "antigravity"):
        sys.modules.pop(module, None)
    run = JobRunFactory(job_type=job_type)
    drain()
    run.refresh_from_db()
    assert (run.status, run.error["type"]) == ("failed", "django_jobs.exceptions.UnknownJobType")
    if module in ("this", "antigravity"):
        assert module not in sys.modules


@pytest.mark.django_db(transaction=True)
def test_a_task_of_an_installed_app_still_runs_from_its_path() -> None:
    from django_jobs.registry import _resolved
    from django_jobs.tasks_backend import run_id
    from django_jobs.testing import drain
    from tests.testapp.tasks import add

    result = add.enqueue(2, 3)
    _resolved.pop("tests.testapp.tasks.add", None)  # resolved again from the row's path
    drain()
    run = JobRun.objects.get(pk=run_id(result.id))
    assert (run.job_type, run.status, run.output) == ("tests.testapp.tasks.add", "completed", 5)


# --- finding 2: attacker-sized data ------------------------------------------------------

# What one run page may weigh, whatever its run holds. Before the caps a 1 MB input
# rendered as a 405 MB page and 20,000 steps as a 12 MB one.
PAGE_BUDGET = 1_000_000


def deep_input() -> Any:
    """Almost MAX_INPUT_BYTES of lists nested near MAX_DEPTH: the worst to indent."""
    one = nested(MAX_DEPTH - 10)
    return {"x": [one] * 2_600}


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    assert len(response.content) < PAGE_BUDGET, (url, len(response.content))
    return response.content.decode()


def test_a_large_deep_input_renders_cut_with_the_whole_a_download_away(
    admin_client: Client,
) -> None:
    value = deep_input()
    run = start("tests.noop", value)
    html = page(admin_client, f"/admin/django_jobs/jobrun/{run.pk}/change/")
    assert f"truncated, {display.stored_size(value):,} bytes" in html
    url = f"/admin/django_jobs/jobrun/{run.pk}/payload/input/"
    assert f'href="{url}"' in html
    response = admin_client.get(url)
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-input.json"'
    assert json.loads(response.content) == value
    assert len(response.content) < 1_100_000  # compact, not indented


def test_a_small_payload_renders_whole() -> None:
    assert "truncated" not in display.pretty_json({"a": [1, 2, 3]}, whole="/x")


def test_the_step_timeline_loads_and_shows_one_page_of_steps(admin_client: Client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = start("tests.noop", {})
    big = {"blob": "y" * 2_000}
    JobStep.objects.bulk_create(
        (
            JobStep(run=run, step_id=f"s{n}", seq=n, status="completed", output=big)
            for n in range(20_000)
        ),
        batch_size=2_000,  # within MariaDB's largest statement (max_allowed_packet)
    )
    url = f"/admin/django_jobs/jobrun/{run.pk}/change/"
    with CaptureQueriesContext(connection) as queries:
        html = page(admin_client, url)
    assert "steps 1 to 50 of 20,000" in html
    assert ">s49<" in html
    assert ">s50<" not in html
    assert f'href="{url}?steps=2"' in html
    step_queries = [q["sql"] for q in queries if "django_jobs_jobstep" in q["sql"]]
    # The whole output never leaves the database, only its first characters.
    assert not any('"django_jobs_jobstep"."output",' in sql for sql in step_queries)

    html = page(admin_client, f"{url}?steps=400")
    assert "steps 19,951 to 20,000 of 20,000" in html
    assert ">s19999<" in html
    assert "later steps" not in html
    assert "steps 19,951" in page(admin_client, f"{url}?steps=999999")  # the last page
    assert "steps 1 to 50" in page(admin_client, f"{url}?steps=x")

    step = JobStep.objects.get(run=run, step_id="s19999")
    assert f"/admin/django_jobs/jobrun/{run.pk}/steps/{step.pk}/output/" in html
    whole = admin_client.get(f"/admin/django_jobs/jobrun/{run.pk}/steps/{step.pk}/output/")
    assert whole.status_code == 200
    assert json.loads(whole.content) == big


def test_a_step_preview_links_to_its_whole_value(admin_client: Client) -> None:
    run = start("tests.noop", {})
    long = JobStep.objects.create(
        run=run, step_id="long", seq=0, status="completed", output="z" * 5_000
    )
    short = JobStep.objects.create(
        run=run, step_id="short", seq=1, status="failed", error={"m": "e"}
    )
    html = page(admin_client, f"/admin/django_jobs/jobrun/{run.pk}/change/")
    assert f"/admin/django_jobs/jobrun/{run.pk}/steps/{long.pk}/output/" in html
    assert "5,002 characters" in html
    assert f"/steps/{short.pk}/" not in html  # shown whole
    assert "&quot;m&quot;: &quot;e&quot;" in html


def test_a_huge_error_message_is_cut_when_stored() -> None:
    run = start("tests.loud_failure", {"size": 5_000_000})
    drain()
    run.refresh_from_db()
    assert run.status == "failed"
    message, trace = run.error["message"], run.error["traceback"]
    assert len(message) < MAX_ERROR_MESSAGE + 100
    assert "characters cut" in message
    assert len(trace) < MAX_TRACEBACK + 100
    assert "characters cut" in trace
    assert trace.rstrip().endswith("x")  # the end of a traceback is kept: its last line


def test_a_huge_stored_error_renders_cut(admin_client: Client) -> None:
    """A row stored before the cap (or written by hand) still renders within budget."""
    run = start("tests.noop", {})
    error = {
        "type": "builtins.ValueError",
        "message": "m" * 5_000_000,
        "traceback": "t" * 5_000_000,
    }
    JobRun.objects.filter(pk=run.pk).update(status="failed", error=error)
    html = page(admin_client, f"/admin/django_jobs/jobrun/{run.pk}/change/")
    assert html.count(f'href="/admin/django_jobs/jobrun/{run.pk}/payload/error/"') == 2
    assert "truncated, 5,000,000 characters" in html
    assert "truncated, 5,000,000 bytes" in html
    assert (
        json.loads(admin_client.get(f"/admin/django_jobs/jobrun/{run.pk}/payload/error/").content)
        == error
    )


def test_many_children_link_to_the_filtered_run_list(admin_client: Client) -> None:
    parent = start("tests.noop", {})
    JobRun.objects.bulk_create(
        JobRun(job_type="tests.noop", pool="default", input={}, parent=parent, root=parent)
        for _ in range(120)
    )
    start("tests.noop", {})  # not a child
    html = page(admin_client, f"/admin/django_jobs/jobrun/{parent.pk}/change/")
    assert f'href="/admin/django_jobs/jobrun/?parent={parent.pk}"' in html
    listing = page(admin_client, f"/admin/django_jobs/jobrun/?parent={parent.pk}")
    assert "120 results" in listing or "120 job runs" in listing


@pytest.mark.parametrize(
    "path",
    ["payload/input/", "payload/error/", "steps/1/output/"],
)
def test_downloads_need_the_permission_to_view_runs(path: str) -> None:
    run = start("tests.noop", {"secret": 1})
    url = f"/admin/django_jobs/jobrun/{run.pk}/{path}"
    anonymous = Client().get(url)
    assert anonymous.status_code == 302
    assert "/login/" in anonymous["Location"]
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get(url).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get(url).status_code in (200, 404)  # no step 1 of this run: 404


@pytest.mark.parametrize(
    "path",
    [
        "payload/lease_token/",
        "payload/__class__/",
        "steps/1/input/",
        "steps/99999999999999999999/output/",
    ],
)
def test_downloads_serve_only_payloads(admin_client: Client, path: str) -> None:
    run = start("tests.noop", {})
    assert admin_client.get(f"/admin/django_jobs/jobrun/{run.pk}/{path}").status_code == 404
    for run_id in ("x", "99999999999999999999", str(run.pk + 1000)):
        url = f"/admin/django_jobs/jobrun/{run_id}/payload/input/"
        assert admin_client.get(url).status_code == 404


def test_tags_and_cancel_reasons_are_bounded() -> None:
    with pytest.raises(InvalidJobInput, match="at most 50 tags"):
        start("tests.noop", {}, tags=[f"t{n}" for n in range(51)])
    run = start("tests.noop", {}, tags=[f"t{n}" for n in range(50)])
    with pytest.raises(InvalidJobInput, match="reason is longer than 1000"):
        cancel(run.pk, reason="r" * 1001)
    run.refresh_from_db()
    assert run.status == "pending"
    assert cancel(run.pk, reason="r" * 1000) == 1


# --- finding 6: terminal escapes in command output --------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[1;31mFAKE: all pools healthy\u202e"


def test_pause_and_cancel_reasons_refuse_control_characters() -> None:
    from django_jobs.pools import pause_pool

    with pytest.raises(ValueError, match="control character"):
        pause_pool("default", reason=ESCAPES)
    run = start("tests.noop", {})
    with pytest.raises(InvalidJobInput, match="control character"):
        cancel(run.pk, reason=ESCAPES)
    with pytest.raises(CommandError, match="control character"):
        call_command("jobpool", "pause", "default", "--reason", "a\x1b[2Jb")


def test_commands_print_stored_escapes_as_visible_text() -> None:
    """Rows written before the checks, or by hand: the output escapes them anyway."""
    from django.utils import timezone

    from django_jobs.models import JobPool, Worker

    JobPool.objects.create(name="mail", paused_at=timezone.now(), pause_reason=ESCAPES)
    Worker.objects.create(hostname=ESCAPES, pid=1, pools=[ESCAPES], concurrency=1)
    run = start("tests.noop", {}, pool="mail")
    JobRun.objects.filter(pk=run.pk).update(
        status="running", progress={"done": 1, "total": 2, "message": ESCAPES}
    )
    for command in (["jobstatus"], ["jobstatus", "--json"], ["jobpool", "list"]):
        out = io.StringIO()
        call_command(*command, stdout=out)
        text = out.getvalue()
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", text), (command, text)
    assert "\\x1b]0;owned\\x07" in text  # jobpool list: visible, not acted on


# --- finding 7: safe defaults ------------------------------------------------------------


def test_the_metrics_port_listens_on_this_machine_by_default() -> None:
    import inspect

    from django_jobs import metrics
    from django_jobs.management.commands.runjobworker import Command

    assert inspect.signature(metrics.serve).parameters["addr"].default == "127.0.0.1"
    parser = Command().create_parser("manage.py", "runjobworker")
    assert parser.parse_args(["--metrics-port", "9400"]).metrics_addr == "127.0.0.1"


def test_failed_steps_errors_render_cut_and_load_only_their_cuts(admin_client: Client) -> None:
    """A page of failed steps whose errors were stored before the caps (or by hand)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = start("tests.noop", {})
    error = {
        "type": "builtins.ValueError",
        "message": "m" * 1_000_000,
        "traceback": "t" * 1_000_000,
    }
    JobStep.objects.bulk_create(
        (JobStep(run=run, step_id=f"s{n}", seq=n, status="failed", error=error) for n in range(60)),
        batch_size=4,  # within MariaDB's largest statement (max_allowed_packet)
    )
    url = f"/admin/django_jobs/jobrun/{run.pk}/change/"
    with CaptureQueriesContext(connection) as queries:
        html = page(admin_client, url)
    assert html.count("<strong>builtins.ValueError</strong>") == 50
    assert html.count("truncated, 1,000,000 characters") == 100
    step = JobStep.objects.get(run=run, step_id="s0")
    assert f'href="/admin/django_jobs/jobrun/{run.pk}/steps/{step.pk}/error/"' in html
    step_queries = [q["sql"] for q in queries if "django_jobs_jobstep" in q["sql"]]
    # The whole column, as an item of the SELECT list (not inside a JSON key lookup).
    quote = connection.ops.quote_name
    whole = re.compile(
        r"(?<!JSON_EXTRACT\()" + re.escape(f"{quote('django_jobs_jobstep')}.{quote('error')},")
    )
    assert not any(whole.search(sql) for sql in step_queries)


# --- the admin under many children and odd search terms ----------------------------------


@pytest.mark.django_db
def test_the_run_page_of_a_run_with_more_than_50_children_renders() -> None:
    # children_links calls format_html() without arguments for the "more" line:
    # deprecated in Django 5.x (an error under -W error), a TypeError in Django 6.
    parent = JobRunFactory()
    JobRunFactory.create_batch(51, parent=parent, root=parent)
    client = operator()
    client.raise_request_exception = False
    url = reverse("admin:django_jobs_jobrun_change", args=[parent.pk])
    assert client.get(url).status_code == 200


@pytest.mark.django_db
def test_searching_a_unicode_digit_does_not_crash_the_changelist() -> None:
    JobRunFactory()
    client = operator()
    client.raise_request_exception = False
    # "²".isdigit() is True but int("²") raises ValueError.
    assert client.get(CHANGELIST, {"q": "²"}).status_code == 200
