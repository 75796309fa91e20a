"""A real browser drives the admin: log in, filter failed runs, retry one.

Headless Chromium (Debian's ``chromium`` package) driven by Playwright for
Python. Set ``DJANGO_JOBS_SCREENSHOTS=<dir>`` to keep the screenshots (the
docs' images are made that way); otherwise they go to the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobs.models import JobRun, JobStep, Status
from tests.factories import JobRunFactory, JobStepFactory, RunningJobRunFactory, WorkerFactory

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed (apt-get install chromium); the browser test needs it",
    ),
]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("DJANGO_JOBS_SCREENSHOTS", tmp_path))
    target.mkdir(parents=True, exist_ok=True)
    return target


def make_runs() -> JobRun:
    now = timezone.now()
    worker = WorkerFactory(hostname="worker-1", pid=4242)
    for n in range(3):
        JobRunFactory(
            status=Status.COMPLETED,
            job_type="tests.echo",
            pool="echo",
            input={"n": n},
            created_at=now - timedelta(seconds=300 - n),
            started_at=now - timedelta(seconds=299 - n),
            finished_at=now - timedelta(seconds=298.6 - n),
        )
    JobRunFactory(job_type="tests.noop")
    RunningJobRunFactory(
        job_type="tests.three_steps",
        claimed_by=worker,
        created_at=now - timedelta(seconds=40),
        started_at=now - timedelta(seconds=39),
        progress={"done": 2, "total": 3, "message": "sending receipts", "at": now},
    )
    error = {
        "type": "builtins.RuntimeError",
        "message": "payment gateway timed out",
        "traceback": "Traceback (most recent call last):\n"
        '  File "shop/jobs.py", line 31, in fulfil_order\n'
        '    charge = ctx.step("charge", lambda: payments.charge(order_id))\n'
        '  File "shop/payments.py", line 12, in charge\n'
        '    raise RuntimeError("payment gateway timed out")\n'
        "RuntimeError: payment gateway timed out",
        "attempt": 3,
        "retryable": True,
    }
    failed = JobRunFactory(
        status=Status.FAILED,
        job_type="tests.flaky",
        attempts=3,
        max_attempts=3,
        input={"order_id": 42},
        error=error,
        created_at=now - timedelta(seconds=95),
        started_at=now - timedelta(seconds=12),
        finished_at=now - timedelta(seconds=3.5),
        claimed_by=worker,
        worker_ids=[str(worker.pk)] * 3,
        # Left by the handler's last attempt: history once the run has ended.
        progress={"done": 1, "total": 3, "message": "charging", "at": now},
    )
    JobStepFactory(
        run=failed,
        step_id="reserve_stock",
        seq=1,
        output={"reserved": 2},
        started_at=now - timedelta(seconds=90),
        finished_at=now - timedelta(seconds=89.8),
    )
    JobStepFactory(
        run=failed,
        step_id="charge",
        seq=2,
        status=JobStep.StepStatus.FAILED,
        output=None,
        error=error,
        attempts=3,
        started_at=now - timedelta(seconds=11.9),
        finished_at=now - timedelta(seconds=3.6),
    )
    JobRunFactory(
        status=Status.FAILED,
        job_type="tests.permanent",
        attempts=1,
        max_attempts=5,
        error={"type": "tests.testapp.jobs.PermanentError", "message": "no", "retryable": False},
        created_at=now - timedelta(seconds=61),
        started_at=now - timedelta(seconds=60),
        finished_at=now - timedelta(seconds=59.9),
    )
    return failed


def fits(page: Any, selector: str) -> bool:
    """Whether the element shows all its content without scrolling sideways."""
    return bool(
        page.evaluate(
            "(s) => { const e = document.querySelector(s); "
            "return e.scrollWidth <= e.clientWidth; }",
            selector,
        )
    )


def test_operator_filters_failed_runs_and_retries_one(
    live_server: Any, screenshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    User.objects.create_superuser("operator", password="s3cret-pass")
    failed = make_runs()
    # Playwright's sync API runs an event loop in this thread; the ORM calls
    # below happen between its calls, never concurrently with them.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(15_000)
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_jobs/jobrun/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "s3cret-pass")
        page.click("input[type=submit]")
        expect(page.locator("#result_list")).to_be_visible()
        # Every run, progress included, fits the window: no scrolling sideways.
        assert fits(page, "#changelist .results"), "the run list scrolls sideways at 1,400 px"
        expect(page.locator("#result_list")).to_contain_text("2 / 3 (67%) sending receipts")
        expect(page.locator("#result_list")).not_to_contain_text("charging")  # a finished run's

        page.click("#changelist-filter a:text-is('Failed')")
        expect(page).to_have_url(re.compile(r"status__exact=failed"))
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"))
        assert fits(page, "#changelist .results")
        page.screenshot(path=str(screenshots / "admin-failed-runs.png"), full_page=True)

        page.click(f"#result_list a[href*='/jobrun/{failed.pk}/change/']")
        summary = page.locator(".dj-summary")
        expect(summary).to_contain_text("builtins.RuntimeError: payment gateway timed out")
        expect(summary.locator("details.dj-traceback[open]")).to_contain_text("shop/payments.py")
        expect(summary).to_contain_text("3 of 3")
        expect(summary).to_contain_text("91.5 s from creation to end · latest execution 8.5 s")
        expect(summary).to_contain_text("worker-1:4242 (ran its last attempt)")
        # What matters is on the first screen, not 1,000 px down.
        box = summary.locator(".dj-error").bounding_box()
        assert box is not None
        assert box["y"] < 400, box
        expect(page.locator("body")).not_to_contain_text("(running)")
        expect(page.locator(".field-progress_display")).to_contain_text("its last report")
        # A failed step's error reads as the run's does, its traceback folded.
        step = page.locator(".dj-steps tr", has_text="charge")
        expect(step.locator(".dj-error")).to_contain_text("builtins.RuntimeError")
        expect(step.locator("details.dj-traceback:not([open])")).to_have_count(1)
        expect(page.locator("text=reserve_stock")).to_be_visible()
        page.screenshot(path=str(screenshots / "admin-run-page.png"), full_page=True)

        page.goto(f"{live_server.url}/admin/django_jobs/jobrun/pools/")
        crumbs = page.locator("nav .breadcrumbs")
        expect(crumbs).to_have_text(re.compile(r"Home\W+Jobs\W+Job runs\W+Pools"))
        header = page.locator("#header").bounding_box()
        bar = crumbs.bounding_box()
        assert header is not None
        assert bar is not None
        assert bar["y"] == header["y"] + header["height"], (header, bar)
        page.screenshot(path=str(screenshots / "admin-pools.png"), full_page=True)

        page.goto(f"{live_server.url}/admin/django_jobs/jobrun/{failed.pk}/change/")
        page.click("a.dj-op-retry")
        expect(page.locator("h1")).to_contain_text("Retry")
        page.click("input.dj-confirm")
        expect(page.locator(".messagelist")).to_contain_text("1 run changed")
        page.screenshot(path=str(screenshots / "admin-retried.png"), full_page=True)
        browser.close()

    failed.refresh_from_db()
    assert failed.status == Status.PENDING
    assert failed.attempts == 0
