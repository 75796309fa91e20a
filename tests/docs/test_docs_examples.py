"""Run every Python example of the documentation, so the docs cannot rot.

Every ```python block of every page under docs/ is one test, with the id
``<page>:<n>`` for the n-th ```python block of that page, counted from 1. A
block runs like a module (it is one, in ``sys.modules``, while it runs, so
``@task`` functions can be imported by their path), in a fresh namespace, and
proves itself with plain ``assert`` statements; a zero-argument function
named ``test_*`` that it defines is called afterwards, as pytest would. It may
define handlers with ``@job`` (unregistered after the test), connect
receivers to the ``django_jobs.signals`` (disconnected after the test), start
runs and run them with ``django_jobs.testing.drain()``. Each test gets a real
database with real transactions, emptied afterwards. A failing block's
traceback points at the line of the page.

A block whose first line is ``# settings.py`` is a settings fragment: it is
executed, then its ``DJANGO_JOBS``, ``TASKS`` and other settings are checked
with django_jobs' system checks (no error may remain), ``INSTALLED_APPS`` must
name ``django_jobs`` and ``USE_TZ`` may only be ``True``.

An HTML comment on the line just above a ```python fence (it renders as
nothing) changes how the block runs:

    <!-- docs-test: continue -->

runs every earlier ```python block of the page first (skipped ones excepted),
in the same namespace (a tutorial that builds on its earlier blocks), and

    <!-- docs-test: skip: the reason, for the reader of the Markdown -->

does not run the block; the reason is required, and every skipped block is
listed in SKIPPED below with the text it must contain, so a new skip is a
reviewed change of this file. Skipped blocks still count in the numbering.
Other fence languages (```text, ```console, ```sql, unlabelled) never run.

EXTRA_CHECKS run after a block, in its namespace, to exercise what the page
claims but the example cannot show with ``drain()``: a real worker in a thread,
time passing, races. KNOWN_PROBLEMS marks blocks that fail because of a bug in
django_jobs as strict expected failures; a block importing a package-level name
of docs/api.md that ``django_jobs`` does not export is one as well.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import django
import pytest
from django.core.checks import run_checks
from django.db import IntegrityError, connections, transaction
from django.dispatch import Signal
from django.test import override_settings

import django_jobs
from django_jobs import conf, registry, transitions
from django_jobs import signals as job_signals
from django_jobs.api import cancel
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.storage import claiming, leases
from django_jobs.testing import drain
from django_jobs.worker import JobWorker
from tests.factories import WorkerFactory
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = tuple(
    sorted(
        path.relative_to(DOCS).as_posix()
        for path in DOCS.rglob("*.md")
        if "_build" not in path.parts
    )
)
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^<!-- docs-test: (?P<verb>skip|continue)(?::(?P<reason>.*?))? -->$")
SETTINGS_FRAGMENT = "# settings.py"
# The package-level names docs/api.md documents.
CONTRACT_NAMES = frozenset(
    {"JobContext", "RetryPolicy", "cancel", "job", "retry", "start", "start_many"}
)
# block id -> text the block must contain: every skipped block, reviewed.
SKIPPED: dict[str, str] = {
    "from-celery.md:1": "from celery import shared_task",
}


@dataclass(frozen=True)
class Example:
    page: str
    number: int
    line: int  # of the first line of code in the page, from 1
    source: str
    skip_reason: str | None = None
    continues: bool = False

    @property
    def id(self) -> str:
        return f"{self.page}:{self.number}"

    @property
    def is_settings(self) -> bool:
        return self.source.lstrip().startswith(SETTINGS_FRAGMENT)


def extract(page: str) -> list[Example]:
    """Return the ```python blocks of ``page``, numbered from 1."""
    lines = (DOCS / page).read_text().splitlines()
    examples: list[Example] = []
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i].strip())
        if lines[i].strip().startswith("<!-- docs-test"):
            following = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            assert marker, f"{page}:{i + 1}: unknown marker {lines[i].strip()!r}"
            lang = following["lang"] if following else None
            assert lang == "python", (
                f"{page}:{i + 1}: a docs-test marker must be just above a ```python fence"
            )
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = i + 1
        closing = f"{match['indent']}```"
        while end < len(lines) and lines[end].rstrip() != closing:
            end += 1
        if match["lang"] == "python":
            above = MARKER.match(lines[i - 1].strip()) if i > 0 else None
            reason = None
            if above and above["verb"] == "skip":
                reason = (above["reason"] or "").strip()
                assert len(reason) >= 10, f"{page}:{i}: a skipped block needs a reason"
            examples.append(
                Example(
                    page=page,
                    number=len(examples) + 1,
                    line=i + 2,
                    source=textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n",
                    skip_reason=reason,
                    continues=bool(above and above["verb"] == "continue"),
                )
            )
        i = end + 1
    return examples


def chain(example: Example) -> list[Example]:
    """``example`` and, if it continues, every runnable block of its page before it."""
    if not example.continues:
        return [example]
    earlier = extract(example.page)[: example.number - 1]
    assert earlier, f"{example.id} continues, but is the page's first block"
    return [block for block in earlier if block.skip_reason is None] + [example]


def run_block(example: Example, module: types.ModuleType) -> None:
    """Execute ``example`` in ``module``'s namespace, then the ``test_*`` functions it defined."""
    namespace = module.__dict__
    before = set(namespace)
    # Padded so that line numbers in tracebacks are those of the page.
    code = compile("\n" * (example.line - 1) + example.source, str(DOCS / example.page), "exec")
    exec(code, namespace)
    for name in sorted(set(namespace) - before):
        if name.startswith("test_") and callable(namespace[name]):
            namespace[name]()
    if example.is_settings:
        check_settings(example, namespace)


def check_settings(example: Example, namespace: dict[str, Any]) -> None:
    """A settings fragment: valid for django_jobs' checks, and naming the app."""
    names = {name: value for name, value in namespace.items() if name.isupper()}
    assert names, f"{example.id} defines no setting"
    apps = names.pop("INSTALLED_APPS", None)
    if apps is not None:
        assert "django_jobs" in apps, f"{example.id}: INSTALLED_APPS lacks django_jobs"
    databases = names.pop("DATABASES", None)
    if databases is not None:
        assert databases["default"]["ENGINE"], f"{example.id}: no database engine"
    assert names.get("USE_TZ", True) is True, f"{example.id}: django_jobs needs USE_TZ = True"
    with override_settings(**names):
        assert conf.problems() == []
        found = run_checks(databases=[])  # the settings checks; none that query
        serious = [m for m in found if m.id and m.id.startswith("django_jobs.")]
        assert serious == [], f"{example.id}: {serious}"


@contextmanager
def example_module(example: Example) -> Iterator[types.ModuleType]:
    """A module for the block's namespace, importable by name while the block runs.

    It sits inside an installed app, as a user's jobs.py and tasks.py do: the tasks
    backend resolves a task path only there.
    """
    slug = re.sub(r"\W", "_", example.page[:-3])
    module = types.ModuleType(f"tests.testapp.docs_example_{slug}_{example.number}")
    sys.modules[module.__name__] = module
    try:
        yield module
    finally:
        del sys.modules[module.__name__]


# --- checks that go beyond what drain() can show ---------------------------------------


@contextmanager
def worker_thread(pools: list[str]) -> Iterator[JobWorker]:
    """Run a real JobWorker (claims, heartbeats, watchdog) in a thread for the block."""
    worker = JobWorker(pools, concurrency=2, poll_interval=0.05)

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
    assert transitions.wake_sleepers() == 1  # what a worker's watchdog does every tick
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
    (claimed_first, claimed_other) = claiming.claim_batch(WorkerFactory().pk, None, 10)
    assert [c.run_id for c in (claimed_first, claimed_other)] == [first.pk, other.pk]
    # The key of account 7 is busy: the second run is passed over, not claimed.
    assert claiming.claim_batch(WorkerFactory().pk, None, 10) == []
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.filter(pk=second.pk).update(status=Status.RUNNING)
    leases.complete(claimed_first, None)
    (claimed_second,) = claiming.claim_batch(WorkerFactory().pk, None, 10)
    assert claimed_second.run_id == second.pk


def a_claim_takes_five_runs_of_the_partner_key(ns: dict[str, Any], settings: Any) -> None:
    """keys.md: a limit of 5 lets five runs of the key run at once, not a sixth."""
    ns["call_partner"].start_many([{"n": n} for n in range(7)])
    batch = claiming.claim_batch(WorkerFactory().pk, None, 10)
    assert len(batch) == 5
    slots = JobRun.objects.filter(status=Status.RUNNING).values_list("concurrency_slot", flat=True)
    assert sorted(slots) == [0, 1, 2, 3, 4]
    assert claiming.claim_batch(WorkerFactory().pk, None, 10) == []


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
    "keys.md:2": ("docs.call_partner", (a_claim_takes_five_runs_of_the_partner_key,)),
    "keys.md:4": ("docs.welcome_email", (racing_starts_share_one_run,)),
}

# block id -> (text the block must contain, what is wrong in django_jobs)
KNOWN_PROBLEMS: dict[str, tuple[str, str]] = {}


def missing_exports(source: str) -> list[str]:
    """Documented package-level names that the block imports but django_jobs lacks."""
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
            if example.skip_reason is not None:
                continue
            marks = []
            missing = missing_exports(example.source)
            if missing:
                reason = f"django_jobs does not export {', '.join(missing)} (docs/api.md)"
                marks.append(pytest.mark.xfail(strict=True, raises=ImportError, reason=reason))
            if example.id in KNOWN_PROBLEMS:
                guard, reason = KNOWN_PROBLEMS[example.id]
                assert guard in example.source, f"{example.id} moved; update KNOWN_PROBLEMS"
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            found.append(pytest.param(example, id=example.id, marks=marks))
    return found


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unregister the handlers and disconnect the receivers a block added."""
    if django.VERSION < (6, 0):
        # The pages import Django 6's django.tasks; on 5.2 the backport stands in.
        import django_tasks

        monkeypatch.setitem(sys.modules, "django.tasks", django_tasks)
    handlers = set(registry.all_handlers())
    receivers = {
        signal: list(signal.receivers)
        for signal in vars(job_signals).values()
        if isinstance(signal, Signal)
    }
    try:
        yield
    finally:
        for job_type in set(registry.all_handlers()) - handlers:
            registry.unregister(job_type)
        for signal, before in receivers.items():
            with signal.lock:
                signal.receivers = before
                signal.sender_receivers_cache.clear()


@pytest.mark.parametrize("example", params())
@pytest.mark.usefixtures("isolated")
def test_example(example: Example, settings: Any) -> None:
    with example_module(example) as module:
        for block in chain(example):
            run_block(block, module)
        guard, checks = EXTRA_CHECKS.get(example.id, ("", ()))
        assert guard in example.source, f"{example.id} moved; update EXTRA_CHECKS"
        for check in checks:
            check(module.__dict__, settings)


def test_every_skip_is_reviewed() -> None:
    skipped = {
        example.id: example
        for page in PAGES
        for example in extract(page)
        if example.skip_reason is not None
    }
    assert set(skipped) == set(SKIPPED), "a skipped block must be listed in SKIPPED"
    for block_id, guard in SKIPPED.items():
        assert guard in skipped[block_id].source, f"{block_id} moved; update SKIPPED"


def test_extra_checks_and_known_problems_name_existing_blocks() -> None:
    ids = {example.id for page in PAGES for example in extract(page)}
    assert set(EXTRA_CHECKS) <= ids
    assert set(KNOWN_PROBLEMS) <= ids


def test_readme_links_to_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links, "README.md links to no page of the documentation"
    assert [link for link in links if not (ROOT / link).exists()] == []


# --- the harness itself fails on broken examples --------------------------------------


def broken(source: str, page: str = "tutorial.md") -> Example:
    return Example(page=page, number=99, line=1, source=textwrap.dedent(source))


@pytest.mark.usefixtures("isolated")
@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("assert 1 + 1 == 3\n", AssertionError),
        ("from django_jobs import strat\n", ImportError),
        ("from django_jobs import start\nstart('docs.no_such_job')\n", LookupError),
        ("def test_wrong():\n    assert False\n", AssertionError),
        ("# settings.py\nDJANGO_JOBS = {'HEARTBEAT': 5}\n", AssertionError),
        ("# settings.py\nINSTALLED_APPS = ['django.contrib.auth']\n", AssertionError),
    ],
)
def test_a_broken_example_fails(source: str, error: type[Exception]) -> None:
    example = broken(source)
    with pytest.raises(error), example_module(example) as module:
        run_block(example, module)


def test_markers_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    page.write_text("<!-- docs-test: skip -->\n```python\npass\n```\n")
    with pytest.raises(AssertionError, match="needs a reason"):
        extract("page.md")
    page.write_text("<!-- docs-test: skip: a good reason -->\n\n```python\npass\n```\n")
    with pytest.raises(AssertionError, match="just above"):
        extract("page.md")
    page.write_text("<!-- docs-test: run -->\n```python\npass\n```\n")
    with pytest.raises(AssertionError, match="unknown marker"):
        extract("page.md")
