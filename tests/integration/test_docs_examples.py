"""Run the Python examples of the concept pages in docs/, so the docs cannot rot.

Every ```python block of the pages in PAGES is one test, with the id
``<page>:<n>`` for the n-th ```python block of that page, counted from 1. A
block runs like a script, in a fresh namespace, and proves itself with plain
``assert`` statements. It may define handlers with ``@job`` (job types starting
with ``docs.``; they are unregistered after the test), connect receivers to
the ``django_jobs.signals`` (disconnected after the test), start runs and run
them with ``django_jobs.testing.drain()``. Each test gets a real database with
real transactions, emptied afterwards. A failing block's traceback points at
the line of the page.

Blocks that are not meant to run (settings fragments, shell sessions,
signatures) use another fence language (```text, ```console), or have the
marker comment

    <!-- docs-test: skip -->

on the line just above their ```python fence (it renders as nothing); they
still count in the numbering.

EXTRA_CHECKS run after a block, in its namespace, to exercise what the page
claims but the example cannot show with ``drain()``: a real worker in a thread,
time passing, races. KNOWN_PROBLEMS marks blocks that fail because of a bug in
django_jobs as strict expected failures; a block importing a public name that
DESIGN.md promises but ``django_jobs`` does not export is one as well.
"""

from __future__ import annotations

import ast
import re
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction
from django.dispatch import Signal

import django_jobs
from django_jobs import claims, lifecycle, registry
from django_jobs import signals as job_signals
from django_jobs.api import cancel
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.testing import drain
from django_jobs.worker import Worker
from tests.factories import WorkerFactory
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ("steps.md", "children.md", "cancellation.md", "timeouts.md", "keys.md", "signals.md")
SKIP_MARKER = "<!-- docs-test: skip -->"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
# The package-level names DESIGN.md promises ("Public names").
CONTRACT_NAMES = frozenset(
    {"JobContext", "RetryPolicy", "cancel", "job", "retry", "start", "start_many"}
)


@dataclass(frozen=True)
class Example:
    page: str
    number: int
    line: int  # of the first line of code in the page, from 1
    source: str
    skip: bool

    @property
    def id(self) -> str:
        return f"{self.page}:{self.number}"


def extract(page: str) -> list[Example]:
    """Return the ```python blocks of ``page``, numbered from 1."""
    lines = (DOCS / page).read_text().splitlines()
    examples: list[Example] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = i + 1
        closing = f"{match['indent']}```"
        while end < len(lines) and lines[end].rstrip() != closing:
            end += 1
        if match["lang"] == "python":
            examples.append(
                Example(
                    page=page,
                    number=len(examples) + 1,
                    line=i + 2,
                    source=textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n",
                    skip=i > 0 and lines[i - 1].strip() == SKIP_MARKER,
                )
            )
        i = end + 1
    return examples


# --- checks that go beyond what drain() can show ---------------------------------------


@contextmanager
def worker_thread(pools: list[str]) -> Iterator[Worker]:
    """Run a real Worker (claims, heartbeats, watchdog) in a thread for the block."""
    worker = Worker(pools, concurrency=2, poll_interval=0.05)

    def target() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="docs-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        worker.request_stop()  # do not wait for the handlers of abandoned runs
        thread.join(30)
        assert not thread.is_alive()


def status_of(run: JobRun) -> str:
    return JobRun.objects.values_list("status", flat=True).get(pk=run.pk)


def sleep_ends_and_run_resumes(ns: dict[str, Any], settings: Any) -> None:
    """children.md: once its wake-up time has passed, a sleeping run resumes."""
    run = ns["run"]
    # Travel past the wake-up time: the recorded wake-up and run_at move into the past.
    past = {"until": "2000-01-01T00:00:00Z"}
    assert JobStep.objects.filter(run=run, step_id="sleep:trial_period").update(output=past) == 1
    JobRun.objects.filter(pk=run.pk).update(run_at="2000-01-01T00:00:00Z")
    assert lifecycle.wake_sleepers() == 1  # what a worker's watchdog does every tick
    assert drain() == 1
    run.refresh_from_db()
    assert (run.status, run.attempts) == (Status.COMPLETED, 1)
    assert ns["emails"] == [("welcome", "ada"), ("trial ends", "ada")]


def running_run_stops_at_check_cancel(ns: dict[str, Any], settings: Any) -> None:
    """cancellation.md: a running run is asked, sees JobCanceled, ends canceled."""
    run = ns["reindex"].start({"batches": 3000})  # thirty seconds, unless canceled
    with worker_thread(["default"]):
        wait_until(lambda: status_of(run) == Status.RUNNING)
        assert cancel(run.id, reason="wrong index") == 1
        assert cancel(run.id) == 0  # already asked
        wait_until(lambda: status_of(run) == Status.CANCELED, timeout=10)
    run.refresh_from_db()
    assert (run.cancel_reason, run.output) == ("wrong index", None)
    assert run.cancel_requested_at is not None


def an_ignored_cancel_is_fenced_after_the_grace(ns: dict[str, Any], settings: Any) -> None:
    """cancellation.md: a handler ignoring the request is fenced after CANCEL_GRACE."""
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "CANCEL_GRACE": 0.5}
    release = threading.Event()

    @registry.job("docs.stubborn")
    def stubborn(ctx: Any) -> str:
        release.wait(30)  # never looks at ctx.cancel_requested
        return "late"

    run = stubborn.start()
    with worker_thread(["default"]) as worker:
        wait_until(lambda: status_of(run) == Status.RUNNING)
        assert cancel(run.id) == 1
        wait_until(lambda: status_of(run) == Status.CANCELED, timeout=10)
        release.set()
        wait_until(lambda: worker.finished == 1, timeout=10)
    run.refresh_from_db()
    assert (run.output, run.error["type"]) == (None, "django_jobs.exceptions.JobCanceled")


def watchdog_times_out_and_handler_leaves(ns: dict[str, Any], settings: Any) -> None:
    """timeouts.md: the watchdog marks the run; ctx.cancel_requested lets it leave early."""
    handler = registry.get_handler("docs.crawl")
    registry.register(replace(handler, timeout=0.3))  # ten minutes would be long here
    run = handler.start({"urls": [f"/{n}" for n in range(1000)]})  # ten seconds of work
    with worker_thread(["default"]) as worker:
        wait_until(lambda: status_of(run) == Status.TIMED_OUT, timeout=10)
        # The handler saw cancel_requested and returned: its slot is free again.
        wait_until(lambda: worker.finished == 1, timeout=5)
    run.refresh_from_db()
    assert (run.output, run.error["type"]) == (None, "django_jobs.exceptions.JobTimeout")


def the_claim_skips_a_blocked_key(ns: dict[str, Any], settings: Any) -> None:
    """keys.md: one running run per key, enforced by the database; blocked runs skipped."""
    start = ns["sync_account"].start
    first, second = start({"account_id": 7}), start({"account_id": 7})
    other = start({"account_id": 8})
    (claimed_first, claimed_other) = claims.claim_batch(WorkerFactory().pk, None, 10)
    assert [c.run_id for c in (claimed_first, claimed_other)] == [first.pk, other.pk]
    # The key of account 7 is busy: the second run is passed over, not claimed.
    assert claims.claim_batch(WorkerFactory().pk, None, 10) == []
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=second.pk).update(status=Status.RUNNING)
    claims.complete(claimed_first, None)
    (claimed_second,) = claims.claim_batch(WorkerFactory().pk, None, 10)
    assert claimed_second.run_id == second.pk


def racing_starts_share_one_run(ns: dict[str, Any], settings: Any) -> None:
    """keys.md: callers racing with one idempotency key get the same run."""
    callers = 8
    barrier = threading.Barrier(callers)

    def start_one(_: int) -> int:
        try:
            barrier.wait(timeout=10)
            run: JobRun = ns["welcome_email"].start({"user_id": 3}, idempotency_key="welcome:3")
            return run.pk
        finally:
            connections.close_all()

    with ThreadPoolExecutor(callers) as pool:
        ids = set(pool.map(start_one, range(callers)))
    assert len(ids) == 1
    assert JobRun.objects.filter(idempotency_key="welcome:3").count() == 1


Check = Callable[[dict[str, Any], Any], None]

# block id -> (text the block must contain, so a renumbering cannot misplace it; checks)
EXTRA_CHECKS: dict[str, tuple[str, tuple[Check, ...]]] = {
    "children.md:5": ("docs.trial", (sleep_ends_and_run_resumes,)),
    "cancellation.md:3": (
        "docs.reindex",
        (running_run_stops_at_check_cancel, an_ignored_cancel_is_fenced_after_the_grace),
    ),
    "timeouts.md:1": ("docs.crawl", (watchdog_times_out_and_handler_leaves,)),
    "keys.md:1": ("docs.sync_account", (the_claim_skips_a_blocked_key,)),
    "keys.md:3": ("docs.welcome_email", (racing_starts_share_one_run,)),
}

# block id -> (text the block must contain, what is wrong in django_jobs)
KNOWN_PROBLEMS: dict[str, tuple[str, str]] = {}


def missing_exports(source: str) -> list[str]:
    """Names promised by DESIGN.md that the block imports but django_jobs lacks."""
    return sorted(
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module == "django_jobs"
        for alias in node.names
        if alias.name in CONTRACT_NAMES and not hasattr(django_jobs, alias.name)
    )


def params() -> list[Any]:
    found = []
    for page in PAGES:
        for example in extract(page):
            if example.skip:
                continue
            marks = []
            missing = missing_exports(example.source)
            if missing:
                reason = f"django_jobs does not export {', '.join(missing)} (DESIGN.md)"
                marks.append(pytest.mark.xfail(strict=True, raises=ImportError, reason=reason))
            if example.id in KNOWN_PROBLEMS:
                guard, reason = KNOWN_PROBLEMS[example.id]
                assert guard in example.source, f"{example.id} moved; update KNOWN_PROBLEMS"
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            found.append(pytest.param(example, id=example.id, marks=marks))
    return found


@pytest.fixture
def isolated() -> Iterator[None]:
    """Unregister the handlers and disconnect the receivers a block added."""
    handlers = set(registry.all_handlers())
    receivers = {
        signal: list(signal.receivers)
        for signal in vars(job_signals).values()
        if isinstance(signal, Signal)
    }
    try:
        yield
    finally:
        added = set(registry.all_handlers()) - handlers
        for job_type in added:
            registry.unregister(job_type)
        for signal, before in receivers.items():
            with signal.lock:
                signal.receivers = before
                signal.sender_receivers_cache.clear()
        assert all(t.startswith("docs.") for t in added), f"use docs.* job types: {added}"


@pytest.mark.parametrize("example", params())
@pytest.mark.usefixtures("isolated")
def test_example(example: Example, settings: Any) -> None:
    # Padded so that line numbers in tracebacks are those of the page.
    code = compile("\n" * (example.line - 1) + example.source, str(DOCS / example.page), "exec")
    namespace: dict[str, Any] = {"__name__": f"docs_examples.{example.page[:-3]}_{example.number}"}
    exec(code, namespace)
    guard, checks = EXTRA_CHECKS.get(example.id, ("", ()))
    assert guard in example.source, f"{example.id} moved; update EXTRA_CHECKS"
    for check in checks:
        check(namespace, settings)


def test_every_page_has_runnable_examples_and_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert any(not example.skip for example in extract(page)), page
        assert f"(docs/{page})" in readme, page


def test_extra_checks_and_known_problems_name_existing_blocks() -> None:
    ids = {example.id for page in PAGES for example in extract(page)}
    assert set(EXTRA_CHECKS) <= ids
    assert set(KNOWN_PROBLEMS) <= ids
