"""A real browser drives the admin: log in, filter failed runs, retry one.

Headless Chromium (Debian's ``chromium`` package) driven by Playwright for
Python. Set ``DJANGO_JOBS_SCREENSHOTS=<dir>`` to keep the screenshots (the
docs' images are made that way); otherwise they go to the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_jobs.models import JobRun, Status
from tests.factories import JobRunFactory, JobStepFactory

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
    for n in range(3):
        JobRunFactory(status=Status.COMPLETED, job_type="tests.echo", pool="echo", input={"n": n})
    JobRunFactory(job_type="tests.noop")
    failed = JobRunFactory(
        status=Status.FAILED,
        job_type="tests.flaky",
        attempts=3,
        max_attempts=3,
        input={"order_id": 42},
        error={
            "type": "builtins.RuntimeError",
            "message": "payment gateway timed out",
            "traceback": "Traceback (most recent call last):\n  ...\n"
            "RuntimeError: payment gateway timed out",
            "attempt": 3,
        },
    )
    JobStepFactory(run=failed, step_id="reserve_stock", seq=1, output={"reserved": 2})
    JobRunFactory(
        status=Status.FAILED,
        job_type="tests.permanent",
        error={"type": "PermanentError", "message": "no"},
    )
    return failed


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

        page.click("#changelist-filter a:text-is('Failed')")
        expect(page).to_have_url(re.compile(r"status__exact=failed"))
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(2)
        page.screenshot(path=str(screenshots / "admin-failed-runs.png"), full_page=True)

        page.click(f"#result_list a[href*='/jobrun/{failed.pk}/change/']")
        expect(page.locator("text=payment gateway timed out").first).to_be_visible()
        expect(page.locator("text=reserve_stock")).to_be_visible()
        page.screenshot(path=str(screenshots / "admin-run-page.png"), full_page=True)

        page.click("a.dj-op-retry")
        expect(page.locator("h1")).to_contain_text("Retry")
        page.click("input.dj-confirm")
        expect(page.locator(".messagelist")).to_contain_text("1 run(s) changed")
        page.screenshot(path=str(screenshots / "admin-retried.png"), full_page=True)
        browser.close()

    failed.refresh_from_db()
    assert failed.status == Status.PENDING
    assert failed.attempts == 0
