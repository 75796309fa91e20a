"""Crafted requests to the runs and workers admin answer 4xx, never 500 (issue 32, finding 4).

A query parameter no column can match (a NUL character: PostgreSQL text cannot
hold one), a filter value of the wrong shape, a run id that is not a number in
an action's selection: each is the requester's mistake, answered with a 400 (or
a 404 for an id that names no run), never a server error, on every database.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_jobs.models import JobRun, Status
from tests.factories import JobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_jobrun_changelist")
WORKERS = reverse("admin:django_jobs_worker_changelist")


def user_with(*codenames: str) -> Client:
    user = User.objects.create_user("crafted", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return user_with("view_jobrun", "view_worker")


@pytest.fixture
def operator() -> Client:
    return user_with("view_jobrun", "retry_jobrun", "cancel_jobrun", "run_now_jobrun")


@pytest.fixture
def runs() -> list[JobRun]:
    """Runs with a tenant (the tenant filter shows only when one exists) and a worker."""
    WorkerFactory()
    return [
        JobRunFactory(status=Status.FAILED, attempts=1, tenant_id="acme"),
        JobRunFactory(status=Status.PENDING, tenant_id="acme"),
    ]


@pytest.mark.parametrize(
    "query",
    [
        "tenant=%00",
        "pool=%00",
        "job_type=%00",
        "status=%00",
        "status__exact=%00",
        "q=%00",
        "pool=default&tenant=acme%00",
        "o=%00",
        "p=%00",
        "created_at__gte=%00",
        # Django's own answer to these was a redirect to "?e=1" and a "Database
        # error" page: the database is fine, the request is not.
        "created_at__gte=yesterday",
        "created_at__lt=2026-13-45",
        "parent=abc",
    ],
)
def test_a_bad_run_list_parameter_answers_400(
    viewer: Client, runs: list[JobRun], query: str
) -> None:
    response = viewer.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 400, (query, response.status_code)


@pytest.mark.parametrize("query", ["status=%00", "status__exact=%00", "o=%00%00"])
def test_a_bad_worker_list_parameter_answers_400(
    viewer: Client, runs: list[JobRun], query: str
) -> None:
    assert viewer.get(f"{WORKERS}?{query}").status_code == 400


def test_good_parameters_still_filter(viewer: Client, runs: list[JobRun]) -> None:
    failed = viewer.get(CHANGELIST, {"status__exact": "failed", "tenant": "acme", "o": "-1"})
    assert failed.status_code == 200
    html = failed.content.decode()
    assert reverse("admin:django_jobs_jobrun_change", args=[runs[0].pk]) in html
    assert reverse("admin:django_jobs_jobrun_change", args=[runs[1].pk]) not in html
    assert viewer.get(WORKERS, {"status__exact": "running"}).status_code == 200


def test_an_autocomplete_term_with_a_nul_finds_nothing(viewer: Client, runs: list[JobRun]) -> None:
    # Django's autocomplete view searches runs with the admin's own search.
    response = viewer.get(
        reverse("admin:autocomplete"),
        {"app_label": "django_jobs", "model_name": "jobrun", "field_name": "parent", "term": "\0"},
    )
    assert response.status_code == 200
    assert response.json()["results"] == []


def bulk(client: Client, action: str, selected: list[str], **extra: str) -> Any:
    data = {"action": action, "_selected_action": selected, "index": "0", **extra}
    return client.post(CHANGELIST, data)


@pytest.mark.parametrize("action", ["retry_runs", "cancel_runs", "run_runs_now"])
@pytest.mark.parametrize("bad", ["abc", "\0", "1.5", "-1", "²", "9" * 30])
@pytest.mark.parametrize(
    "extra",
    [{}, {"select_across": "1"}, {"confirm": "yes"}, {"select_across": "1", "confirm": "yes"}],
)
def test_a_selection_that_is_not_run_ids_answers_400_and_changes_nothing(
    operator: Client, runs: list[JobRun], action: str, bad: str, extra: dict[str, str]
) -> None:
    response = bulk(operator, action, [str(runs[0].pk), bad], **extra)
    assert response.status_code == 400, response.status_code
    assert [run.status for run in JobRun.objects.order_by("pk")] == [
        Status.FAILED,
        Status.PENDING,
    ]


def test_a_selection_of_run_ids_still_asks_then_acts(operator: Client, runs: list[JobRun]) -> None:
    asked = bulk(operator, "retry_runs", [str(runs[0].pk)])
    assert asked.status_code == 200
    assert b"are you sure" in asked.content
    done = bulk(operator, "retry_runs", [str(runs[0].pk)], confirm="yes")
    assert done.status_code == 302
    assert JobRun.objects.get(pk=runs[0].pk).status == Status.PENDING


@pytest.mark.parametrize("name", ["retry", "cancel", "run_now"])
@pytest.mark.parametrize("run_id", ["9" * 30, "1%00", "%00"])
def test_a_button_url_with_a_bad_id_answers_404(operator: Client, name: str, run_id: str) -> None:
    url = f"{CHANGELIST}{run_id}/{name.replace('_', '-')}/"
    assert operator.get(url).status_code == 404
    assert operator.post(url, {"confirm": "yes"}).status_code == 404


@pytest.mark.parametrize(
    "path",
    ["payload/input/", f"steps/{'9' * 30}/output/", "payload/input%00/", "steps/1/error%00/"],
)
def test_a_download_url_with_a_bad_part_answers_404(
    viewer: Client, runs: list[JobRun], path: str
) -> None:
    for run_id in (str(runs[0].pk), "9" * 30, "%00"):
        response = viewer.get(f"{CHANGELIST}{run_id}/{path}")
        assert response.status_code in (200, 404), (run_id, path)
        if run_id != str(runs[0].pk) or "%00" in path or "9" * 30 in path:
            assert response.status_code == 404, (run_id, path)


@pytest.mark.parametrize(
    "query", ["steps=%00", "steps=9999999999999999999999", "_changelist_filters=tenant%3D%2500"]
)
def test_the_run_page_ignores_a_bad_page_of_steps(
    viewer: Client, runs: list[JobRun], query: str
) -> None:
    url = reverse("admin:django_jobs_jobrun_change", args=[runs[0].pk])
    assert viewer.get(f"{url}?{query}").status_code == 200


def test_pausing_a_pool_named_with_a_nul_is_refused_with_a_message(runs: list[JobRun]) -> None:
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    url = reverse("admin:django_jobs_jobrun_pools")
    for data in (
        {"pool": "\0", "operation": "pause"},
        {"pool": "default", "operation": "pause", "reason": "a\0b"},
        {"pool": "default", "operation": "\0"},
    ):
        response = client.post(url, data, follow=True)
        assert response.status_code == 200, data
        assert b"errornote" in response.content or b'class="error"' in response.content, data
