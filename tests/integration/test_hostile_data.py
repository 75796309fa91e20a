"""Hostile data (issue 16): deep payloads, huge progress numbers, tenants through parents."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_jobs import start
from django_jobs.exceptions import InvalidJobInput, RunNotFound
from django_jobs.models import JobRun
from django_jobs.payloads import MAX_DEPTH

pytestmark = pytest.mark.django_db


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
    listing = [q["sql"] for q in queries if 'FROM "django_jobs_jobrun"' in q["sql"]]
    assert listing
    assert not any('"django_jobs_jobrun"."input"' in sql for sql in listing)


@pytest.mark.parametrize(
    ("done", "total"),
    [(0, 10**400), (10**400, None), (float("nan"), None), (1e16, None), (-1, None)],
)
def test_progress_beyond_a_sane_range_is_refused(done: Any, total: Any) -> None:
    from django_jobs.context import _progress

    with pytest.raises(ValueError, match="set_progress"):
        _progress(done, total, "")


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
    from django_jobs.context import _progress

    record = _progress(1, 2, "\x1b[1;31mFAKE: all pools healthy")
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
    from django_jobs.testing import drain

    from django_jobs.registry import _resolved
    from tests.testapp.tasks import add

    result = add.enqueue(2, 3)
    _resolved.pop("tests.testapp.tasks.add", None)  # resolved again from the row's path
    drain()
    run = JobRun.objects.get(pk=int(result.id))
    assert (run.job_type, run.status, run.output) == ("tests.testapp.tasks.add", "completed", 5)
