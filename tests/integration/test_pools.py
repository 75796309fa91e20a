"""Pausing and resuming pools: the claim leaves a paused pool's runs, the command and the admin."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_jobs import start
from django_jobs.models import JobPool, JobRun, Status
from django_jobs.pools import pause_pool, paused_pools, resume_pool
from django_jobs.storage import claiming, workers
from django_jobs.testing import drain
from tests.factories import JobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

POOLS = reverse("admin:django_jobs_jobrun_pools")


def claimed(pools: list[str] | None, limit: int = 10) -> set[int]:
    worker = WorkerFactory(pools=pools or [])
    return {claim.run_id for claim in claiming.claim_batch(worker.pk, pools, limit)}


@pytest.mark.parametrize("pools", [["default", "mail"], None])
def test_a_paused_pool_is_not_claimed_from_and_a_resumed_one_is(pools: list[str] | None) -> None:
    mail = JobRunFactory(pool="mail")
    default = JobRunFactory(pool="default")
    claimed(pools, limit=0)  # the claim statement is built (and cached) before the pause
    assert pause_pool("mail", reason="smtp down")
    assert claimed(pools) == {default.pk}
    assert JobRun.objects.get(pk=mail.pk).status == Status.PENDING
    assert resume_pool("mail")
    assert claimed(pools) == {mail.pk}


def test_the_two_statement_claim_also_skips_paused_pools() -> None:
    mail = JobRunFactory(pool="mail")
    pause_pool("mail")
    worker = WorkerFactory()
    assert claiming.claim_two_statements(worker.pk, claiming.candidates(["mail"]), 10) == []
    resume_pool("mail")
    assert [
        c.run_id
        for c in claiming.claim_two_statements(worker.pk, claiming.candidates(["mail"]), 10)
    ] == [mail.pk]


def test_drain_leaves_a_paused_pool_alone() -> None:
    run = start("tests.echo", {"x": 1})  # pool "echo"
    pause_pool("echo")
    assert drain() == 0
    resume_pool("echo")
    assert drain() == 1
    run.refresh_from_db()
    assert run.status == Status.COMPLETED


def test_pause_and_resume_report_whether_they_changed_anything() -> None:
    assert pause_pool("mail", reason="first")
    assert not pause_pool("mail", reason="second")
    assert paused_pools()["mail"].pause_reason == "first"
    assert resume_pool("mail")
    assert not resume_pool("mail")
    assert not resume_pool("never-seen")
    assert paused_pools() == {}


@pytest.mark.parametrize("name", ["", "x" * 101, "a\x00b", None])
def test_bad_pool_names_are_refused(name: object) -> None:
    with pytest.raises(ValueError, match="pool"):
        pause_pool(name)  # type: ignore[arg-type]
    assert not JobPool.objects.exists()


@pytest.mark.parametrize("reason", ["a\x00b", "x" * 1001, 3])
def test_bad_pause_reasons_are_refused(reason: object) -> None:
    with pytest.raises(ValueError, match="pause reason"):
        pause_pool("mail", reason=reason)  # type: ignore[arg-type]
    assert paused_pools() == {}


def test_a_worker_records_the_pools_it_serves() -> None:
    workers.register_worker("host", 1, ["default", "mail"], 4)
    workers.register_worker("host", 2, ["mail"], 4)
    assert list(JobPool.objects.values_list("name", flat=True)) == ["default", "mail"]
    assert paused_pools() == {}


def jobpool(*args: str) -> str:
    out = StringIO()
    call_command("jobpool", *args, stdout=out)
    return out.getvalue()


def test_the_command_pauses_lists_and_resumes() -> None:
    assert jobpool("list") == "No pool is paused.\n"
    assert jobpool("pause", "mail", "reports", "--reason", "deploy") == (
        "Paused 'mail'.\nPaused 'reports'.\n"
    )
    assert jobpool("pause", "mail") == "'mail' was paused already.\n"
    listing = jobpool("list")
    assert "mail paused since" in listing
    assert "reports paused since" in listing
    assert ": deploy" in listing
    assert jobpool("resume", "mail") == "Resumed 'mail'.\n"
    assert jobpool("resume", "mail") == "'mail' was not paused.\n"
    assert set(paused_pools()) == {"reports"}


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["stop", "mail"],
        ["pause"],
        ["pause", ""],
        ["pause", "x" * 101],
        ["pause", "mail", "--reason", "x" * 1001],
        ["resume"],
    ],
)
def test_the_command_refuses_bad_arguments(args: list[str]) -> None:
    with pytest.raises(CommandError):
        call_command("jobpool", *args)
    assert not JobPool.objects.exists()


def staff(*codenames: str) -> Client:
    user = User.objects.create_user(f"u-{'-'.join(codenames)}", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_pools_page_pauses_and_resumes() -> None:
    JobRunFactory(pool="mail")
    client = staff("view_jobrun", "pause_jobpool")
    page = client.get(POOLS)
    assert page.status_code == 200
    assert 'value="pause"' in page.content.decode()
    response = client.post(
        POOLS, {"pool": "mail", "operation": "pause", "reason": "smtp"}, follow=True
    )
    assert "Paused pool &#x27;mail&#x27;" in response.content.decode()
    assert paused_pools()["mail"].pause_reason == "smtp"
    page = client.get(POOLS).content.decode()
    assert "<strong>paused</strong>" in page
    assert 'value="resume"' in page
    client.post(POOLS, {"pool": "mail", "operation": "resume"})
    assert paused_pools() == {}


def test_the_admin_refuses_pausing_without_the_permission() -> None:
    JobRunFactory(pool="mail")
    viewer = staff("view_jobrun")
    page = viewer.get(POOLS)
    assert page.status_code == 200
    assert 'value="pause"' not in page.content.decode()
    assert viewer.post(POOLS, {"pool": "mail", "operation": "pause"}).status_code == 403
    assert paused_pools() == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"pool": "", "operation": "pause"}, "is not a non-empty string"),
        ({"pool": "mail", "operation": "explode"}, "Unknown operation"),
        (
            {"pool": "mail", "operation": "pause", "reason": "a\x00b"},
            "contains a control character",
        ),
        ({"pool": "mail", "operation": "pause", "reason": "x" * 1001}, "longer than 1000"),
    ],
)
def test_the_admin_reports_bad_posts(data: dict[str, str], message: str) -> None:
    client = staff("view_jobrun", "pause_jobpool")
    response = client.post(POOLS, data, follow=True)
    assert message in response.content.decode()
    assert paused_pools() == {}
