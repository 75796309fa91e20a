"""The admin with Django's test client: pages, actions, permissions, escaping, query counts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_jobs.models import JobRun, JobStep, Status
from tests.factories import JobRunFactory, JobStepFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_jobrun_changelist")


def change_url(run: JobRun) -> str:
    return reverse("admin:django_jobs_jobrun_change", args=[run.pk])


def op_url(run: JobRun, name: str) -> str:
    return reverse(f"admin:django_jobs_jobrun_{name}", args=[run.pk])


def user_with(*codenames: str) -> Client:
    user = User.objects.create_user(
        f"user-{'-'.join(codenames) or 'none'}", password="x", is_staff=True
    )
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator() -> Client:
    return user_with(
        "view_jobrun", "retry_jobrun", "cancel_jobrun", "run_now_jobrun", "view_worker"
    )


@pytest.fixture
def viewer() -> Client:
    return user_with("view_jobrun", "view_worker")


def status(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def action(client: Client, name: str, runs: list[JobRun], **extra: str) -> Any:
    data = {"action": name, "_selected_action": [r.pk for r in runs], "index": 0, **extra}
    return client.post(CHANGELIST, data, follow=True)


# --- pages ------------------------------------------------------------------------


def test_changelist_shows_runs_with_badges_and_filters(operator: Client) -> None:
    failed = JobRunFactory(status=Status.FAILED, job_type="tests.flaky")
    done = JobRunFactory(status=Status.COMPLETED, tenant_id="acme")
    response = operator.get(CHANGELIST, {"status__exact": "failed"})
    assert response.status_code == 200
    content = response.content.decode()
    assert f">{failed.pk}<" in content
    assert f">{done.pk}<" not in content
    assert "dj-status-failed" in content
    for title in ("By job type", "By pool", "By tenant", "By status"):
        assert title.lower() in content.lower()


@pytest.mark.parametrize("field", ["id", "tag", "idempotency_key", "job_type"])
def test_search_finds_runs(operator: Client, field: str) -> None:
    run = JobRunFactory(job_type="tests.echo", tags=["vip"], idempotency_key="order-77")
    other = JobRunFactory()
    term = {
        "id": str(run.pk),
        "tag": "tag:vip",
        "idempotency_key": "order-77",
        "job_type": "tests.echo",
    }[field]
    response = operator.get(CHANGELIST, {"q": term})
    pks = [r.pk for r in response.context["cl"].result_list]
    assert pks == [run.pk]
    assert other.pk not in pks


def test_the_changelist_query_count_does_not_grow_with_runs(
    operator: Client, django_assert_max_num_queries: Any
) -> None:
    JobRunFactory.create_batch(3)
    operator.get(CHANGELIST)  # warm caches (content types, sessions)
    with django_assert_max_num_queries(12) as few:
        assert operator.get(CHANGELIST).status_code == 200
    JobRunFactory.create_batch(60)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert operator.get(CHANGELIST).status_code == 200


def test_run_page_escapes_payloads(operator: Client) -> None:
    evil = "<script>alert(1)</script>"
    run = JobRunFactory(
        status=Status.FAILED,
        input={"note": evil},
        error={"type": evil, "message": evil, "traceback": evil, "attempt": 1},
    )
    content = operator.get(change_url(run)).content.decode()
    assert evil not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content


def test_run_page_shows_steps_family_and_worker(operator: Client) -> None:
    worker = WorkerFactory()
    parent = JobRunFactory(job_type="tests.parent")
    run = RunningJobRunFactory(parent=parent, root=parent, claimed_by=worker, output=None)
    child = JobRunFactory(parent=run, root=parent, job_type="tests.echo")
    JobStepFactory(run=run, step_id="charge", output={"id": "ch_1"})
    content = operator.get(change_url(run)).content.decode()
    assert "charge" in content
    assert "ch_1" in content
    assert change_url(parent) in content
    assert change_url(child) in content
    assert reverse("admin:django_jobs_worker_change", args=[worker.pk]) in content


def test_the_run_page_query_count_does_not_grow_with_steps(
    operator: Client, django_assert_max_num_queries: Any
) -> None:
    run = JobRunFactory()
    JobStepFactory.create_batch(2, run=run)
    operator.get(change_url(run))
    with django_assert_max_num_queries(15) as few:
        assert operator.get(change_url(run)).status_code == 200
    JobStepFactory.create_batch(60, run=run)
    JobRunFactory.create_batch(20, parent=run, root=run)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert operator.get(change_url(run)).status_code == 200


def test_run_page_has_no_save_or_delete(operator: Client) -> None:
    content = operator.get(change_url(JobRunFactory())).content.decode()
    assert 'name="_save"' not in content
    assert "deletelink" not in content


def test_workers_and_pools_pages(operator: Client) -> None:
    worker = WorkerFactory(pools=["default", "mail"])
    RunningJobRunFactory(claimed_by=worker)
    JobRunFactory(pool="mail")
    workers = operator.get(reverse("admin:django_jobs_worker_changelist"))
    assert workers.status_code == 200
    assert str(worker) in workers.content.decode()
    pools = operator.get(reverse("admin:django_jobs_jobrun_pools"))
    assert pools.status_code == 200
    rows = {row["status"].name: row["status"] for row in pools.context["pools"]}
    assert rows["default"].counts["running"] == 1
    assert rows["mail"].counts["pending"] == 1
    assert rows["mail"].workers == 1


# --- actions ----------------------------------------------------------------------


def test_bulk_retry_asks_then_retries_and_logs(operator: Client) -> None:
    failed = JobRunFactory(status=Status.FAILED)
    done = JobRunFactory(status=Status.COMPLETED)
    JobStepFactory(run=failed)
    confirm = action(operator, "retry_runs", [failed, done])
    assert b"are you sure" in confirm.content
    assert status(failed) == Status.FAILED
    response = action(operator, "retry_runs", [failed, done], confirm="yes", reset_steps="on")
    assert status(failed) == Status.PENDING
    assert status(done) == Status.COMPLETED
    assert not JobStep.objects.filter(run=failed).exists()
    assert "Retry: 1 run changed, 1 skipped." in response.content.decode()
    entry = LogEntry.objects.get(object_id=str(failed.pk))
    assert "Retry (reset_steps)" in entry.get_change_message()


def test_bulk_cancel_with_cascade(operator: Client) -> None:
    parent = JobRunFactory()
    child = JobRunFactory(parent=parent, root=parent)
    action(operator, "cancel_runs", [parent], confirm="yes", cascade="on")
    assert status(parent) == Status.CANCELED
    assert status(child) == Status.CANCELED


def test_bulk_cancel_without_cascade(operator: Client) -> None:
    parent = JobRunFactory()
    child = JobRunFactory(parent=parent, root=parent)
    action(operator, "cancel_runs", [parent], confirm="yes")
    assert (status(parent), status(child)) == (Status.CANCELED, Status.PENDING)


def test_bulk_run_now(operator: Client) -> None:
    from datetime import timedelta

    from django.utils import timezone

    later = JobRunFactory(run_at=timezone.now() + timedelta(days=1))
    action(operator, "run_runs_now", [later], confirm="yes")
    later.refresh_from_db()
    assert later.run_at <= timezone.now()


def test_run_page_buttons_confirm_then_act(operator: Client) -> None:
    run = JobRunFactory(status=Status.TIMED_OUT)
    page = operator.get(change_url(run)).content.decode()
    assert op_url(run, "retry") in page
    # Only the operations that apply to a timed-out run are offered.
    assert op_url(run, "cancel") not in page
    assert op_url(run, "run_now") not in page
    pending = operator.get(change_url(JobRunFactory())).content.decode()
    assert "dj-op-cancel" in pending
    assert "dj-op-run_now" in pending
    assert "dj-op-retry" not in pending
    assert b"are you sure" in operator.get(op_url(run, "retry")).content
    assert status(run) == Status.TIMED_OUT
    response = operator.post(op_url(run, "retry"), {"confirm": "yes"})
    assert response.status_code == 302
    assert response["Location"] == change_url(run)
    assert status(run) == Status.PENDING
    assert LogEntry.objects.filter(object_id=str(run.pk)).count() == 1


# --- permissions ------------------------------------------------------------------


def test_a_viewer_sees_no_operations(viewer: Client) -> None:
    run = JobRunFactory(status=Status.FAILED)
    changelist = viewer.get(CHANGELIST)
    assert changelist.status_code == 200
    assert "retry_runs" not in changelist.content.decode()
    page = viewer.get(change_url(run)).content.decode()
    assert op_url(run, "retry") not in page


def test_a_forged_bulk_action_without_permission_changes_nothing(viewer: Client) -> None:
    run = JobRunFactory(status=Status.FAILED)
    action(viewer, "retry_runs", [run], confirm="yes")
    action(viewer, "cancel_runs", [run], confirm="yes")
    assert status(run) == Status.FAILED
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("name", ["retry", "cancel", "run_now"])
def test_a_forged_button_post_without_permission_is_refused(viewer: Client, name: str) -> None:
    run = JobRunFactory(status=Status.FAILED)
    assert viewer.post(op_url(run, name), {"confirm": "yes"}).status_code == 403
    assert status(run) == Status.FAILED


def test_one_permission_does_not_grant_another() -> None:
    client = user_with("view_jobrun", "cancel_jobrun")
    run = JobRunFactory(status=Status.FAILED)
    assert client.post(op_url(run, "retry"), {"confirm": "yes"}).status_code == 403
    assert status(run) == Status.FAILED


def test_anonymous_users_are_sent_to_login() -> None:
    run = JobRunFactory(status=Status.FAILED)
    for url in (CHANGELIST, change_url(run), op_url(run, "retry")):
        response = Client().get(url)
        assert response.status_code == 302
        assert "/login/" in response["Location"]
    response = Client().post(op_url(run, "retry"), {"confirm": "yes"})
    assert response.status_code == 302
    assert status(run) == Status.FAILED


def test_csrf_is_enforced() -> None:
    user = User.objects.create_superuser("root", password="x")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    run = JobRunFactory(status=Status.FAILED)
    assert client.post(op_url(run, "retry"), {"confirm": "yes"}).status_code == 403
    response = client.post(
        CHANGELIST, {"action": "retry_runs", "_selected_action": [run.pk], "confirm": "yes"}
    )
    assert response.status_code == 403
    assert status(run) == Status.FAILED


def test_unknown_run_ids_in_button_urls() -> None:
    client = user_with("view_jobrun", "retry_jobrun")
    assert client.get(reverse("admin:django_jobs_jobrun_retry", args=[999999])).status_code == 404
    assert client.get("/admin/django_jobs/jobrun/abc/retry/").status_code in (403, 404)


# --- filters cannot be turned into arbitrary lookups -------------------------------


def test_the_tenant_filter_shows_that_tenant_only(viewer: Client) -> None:
    acme = JobRunFactory(tenant_id="acme")
    globex = JobRunFactory(tenant_id="globex")
    page = viewer.get(CHANGELIST, {"tenant": "acme"}).content.decode()
    assert change_url(acme) in page
    assert change_url(globex) not in page
    # The other list filters still work with the lookups limited to theirs.
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    dates = {
        "created_at__gte": today.isoformat(),
        "created_at__lt": (today + timedelta(days=1)).isoformat(),
    }
    for params in (dates, {"pool": "default"}, {"job_type": "tests.noop"}):
        assert viewer.get(CHANGELIST, params).status_code == 200, params


@pytest.mark.parametrize(
    "forged",
    [
        {"tenant_id__regex": ".*"},
        {"tenant_id__startswith": "a"},
        {"input__secret": "x"},
        {"lease_token__isnull": "False"},
        {"claimed_by__hostname__contains": "a"},
    ],
)
def test_a_forged_lookup_in_the_query_string_lists_nothing(
    viewer: Client, forged: dict[str, str]
) -> None:
    run = JobRunFactory(tenant_id="acme", input={"secret": "x"})
    response = viewer.get(CHANGELIST, forged)
    # Django's admin refuses lookups that are not its list filters: an error
    # page or a redirect back to the unfiltered list, never a filtered listing.
    assert response.status_code in (302, 400)
    assert change_url(run) not in response.content.decode()


# --- issue 17 §5: the run page read at 3 a.m. ---------------------------------------------


def finished_run(**fields: Any) -> JobRun:
    now = timezone.now()
    defaults: dict[str, Any] = {
        "status": Status.FAILED,
        "attempts": 2,
        "max_attempts": 2,
        "claimed_by": WorkerFactory(hostname="w1", pid=7),
        "created_at": now - timedelta(minutes=10),
        "started_at": now - timedelta(seconds=5),
        "finished_at": now,
        "progress": {"done": 1, "total": 3, "message": "charging", "at": now.isoformat()},
        "error": {
            "type": "shop.Declined",
            "message": "card declined",
            "traceback": "Traceback (most recent call last):\nshop.Declined: card declined",
            "attempt": 2,
            "retryable": False,
        },
    }
    return JobRunFactory(**{**defaults, **fields})  # type: ignore[no-any-return]


def test_the_run_page_opens_on_a_summary_of_what_matters(operator: Client) -> None:
    run = finished_run()
    content = operator.get(change_url(run)).content.decode()
    summary = content[content.index('class="module dj-summary"') : content.index(">Run</h2>")]
    assert "<strong>shop.Declined</strong>: card declined" in summary
    assert "attempt 2, not retryable" in summary
    assert '<details class="dj-traceback" open>' in summary
    assert "2 of 2" in summary
    # A parent resumed after its children, or a retried run, started again:
    # its duration counts from its creation, not from its latest start.
    assert "10.0 min from creation to end · latest execution 5.0 s" in summary
    assert content.count("card declined</") == 1  # not again in the field list


def test_a_finished_run_shows_its_last_worker_and_progress_as_history(operator: Client) -> None:
    run = finished_run()
    content = operator.get(change_url(run)).content.decode()
    assert "(running)" not in content
    assert "w1:7</a> (ran its last attempt)" in content
    assert "1 / 3 (33%) charging (its last report, before the run ended)" in content
    listed = operator.get(CHANGELIST).content.decode()
    assert "charging" not in listed


def test_a_running_run_shows_its_worker_and_progress(operator: Client) -> None:
    run = RunningJobRunFactory(progress={"done": 2, "total": 4, "message": "copying"})
    content = operator.get(change_url(run)).content.decode()
    assert "(holds it now; the worker is running)" in content
    assert "2 / 4 (50%) copying" in operator.get(CHANGELIST).content.decode()


def test_times_show_seconds(operator: Client) -> None:
    created = timezone.localtime(timezone.now()).replace(second=42, microsecond=0)
    run = finished_run(created_at=created, finished_at=created + timedelta(seconds=1))
    stamp = created.strftime("%Y-%m-%d %H:%M:42")
    assert f">{stamp}</time>" in operator.get(change_url(run)).content.decode()
    assert f">{stamp}</time>" in operator.get(CHANGELIST).content.decode()


def test_a_failed_steps_error_reads_as_the_runs_does(operator: Client) -> None:
    run = finished_run()
    JobStepFactory(run=run, step_id="charge", status="failed", output=None, error=run.error)
    content = operator.get(change_url(run)).content.decode()
    steps = content[content.index('class="dj-steps"') :]
    assert "<strong>shop.Declined</strong>: card declined" in steps
    assert "attempt 2, not retryable" in steps
    assert '<details class="dj-traceback"><summary>traceback</summary>' in steps
    assert "&quot;retryable&quot;" not in steps  # not raw JSON


# --- the jobs database -------------------------------------------------------------


def test_the_admin_reads_runs_and_workers_from_the_jobs_database(settings: Any) -> None:
    from django.contrib import admin
    from django.test import RequestFactory

    from django_jobs.models import Worker

    # DATABASE names the alias holding the job tables; workers, api and the pools
    # page use it, so the changelist, run pages and workers pages must too.
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASE": "sqlite"}
    request = RequestFactory().get("/")
    for model in (JobRun, Worker):
        assert admin.site._registry[model].get_queryset(request).db == "sqlite", model
