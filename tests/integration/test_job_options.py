"""DJANGO_JOBS["JOB_OPTIONS"]: options for job types and tasks one does not own."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db.models import Max
from django.test import override_settings

from django_jobs import RetryPolicy, start
from django_jobs.joboptions import options_for
from django_jobs.models import Hold, JobRun, Status
from django_jobs.ratelimits import Rate, in_force
from django_jobs.registry import all_handlers, get_handler
from django_jobs.storage import claiming
from django_jobs.tasks_backend import load_option_targets, run_id
from django_jobs.testing import drain
from tests.factories import WorkerFactory
from tests.helpers import operator, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def options(entries: dict[str, Any]) -> Any:
    return override_settings(DJANGO_JOBS={"JOB_OPTIONS": entries})


def e015(entries: Any) -> list[str]:
    with options(entries):
        return [m.msg for m in run_checks(databases=[]) if m.id == "django_jobs.E015"]


def test_settings_replace_what_a_job_declares() -> None:
    declared = get_handler("tests.echo")
    with options(
        {
            "tests.echo": {
                "pool": "other",
                "priority": 7,
                "retry": {"attempts": 4, "base_delay": 0, "jitter": False},
                "timeout": timedelta(seconds=90),
                "concurrency_key": "tests.testapp.keys.by_account",
                "concurrency_limit": 3,
                "rate_limit": "10/m",
            }
        }
    ):
        handler = get_handler("tests.echo")
        assert handler.fn is declared.fn
        assert (handler.pool, handler.priority, handler.timeout) == ("other", 7, 90.0)
        assert handler.retry == RetryPolicy(attempts=4, base_delay=0, jitter=False)
        assert handler.concurrency_limit == 3
        assert handler.rate_limit == Rate(10, 60)
        run = start("tests.echo", {"account": 12})
        assert (run.pool, run.priority) == ("other", 7)
        assert (run.concurrency_key, run.concurrency_limit) == ("account:12", 3)
        # What a caller passes for one run still wins.
        mine = start("tests.echo", {"account": 1}, pool="mine", priority=1, concurrency_key="k")
        assert (mine.pool, mine.priority, mine.concurrency_key) == ("mine", 1, "k")
        # The worker's limits include it.
        assert in_force(all_handlers()).jobs["tests.echo"] == Rate(10, 60)
    # Back to the code's own once the setting is gone.
    assert get_handler("tests.echo") is declared
    assert start("tests.echo", {}).pool == "echo"


def test_the_most_specific_key_sets_each_option() -> None:
    entries = {
        "*": {"priority": 1, "pool": "everything"},
        "tests.*": {"priority": 2, "timeout": 5},
        "tests.e*": {"priority": 3},
        "tests.echo": {"pool": "exact"},
    }
    with options(entries):
        assert options_for("tests.echo") == {"pool": "exact", "priority": 3, "timeout": 5.0}
        assert options_for("tests.noop") == {"pool": "everything", "priority": 2, "timeout": 5.0}
        # Matched case-sensitively.
        assert options_for("TESTS.ECHO") == {"pool": "everything", "priority": 1}


def test_a_retry_policy_and_a_timeout_from_settings_apply_to_attempts() -> None:
    with options(
        {
            "tests.permanent": {"retry": {"attempts": 2, "base_delay": 0}},
            "tests.slow": {"timeout": 0.05},
        }
    ):
        failed = start("tests.permanent", {})
        slow = start("tests.slow", {"seconds": 0.2})
        drain()
    failed.refresh_from_db()
    slow.refresh_from_db()
    # tests.permanent's own policy never retries its error; the setting's does.
    assert (failed.status, failed.attempts) == (Status.FAILED, 2)
    assert slow.status == Status.TIMED_OUT


def test_a_tasks_options_and_its_key_from_its_arguments() -> None:
    with options(
        {
            "tests.testapp.tasks.*": {"pool": "tasks-pool", "priority": 4},
            "tests.testapp.tasks.add": {
                "concurrency_key": "tests.testapp.keys.by_first_argument",
                "concurrency_limit": 2,
            },
            "tests.testapp.tasks.boom": {"retry": RetryPolicy(attempts=3, base_delay=0)},
        }
    ):
        result = tasks.add.enqueue(5, 6)
        run = JobRun.objects.get(pk=run_id(result.id))
        assert (run.pool, run.priority) == ("tasks-pool", 4)
        assert (run.concurrency_key, run.concurrency_limit) == ("first:5", 2)
        boom = tasks.boom.enqueue("again")
        drain("tasks-pool")
        result.refresh()
        boom.refresh()
    assert result.return_value == 11
    # The result names the task's own queue: "tasks-pool" is none of the backend's.
    assert JobRun.objects.get(pk=run_id(boom.id)).attempts == 3


def test_a_worker_finds_the_tasks_given_a_rate_limit() -> None:
    with options({"tests.testapp.tasks.add*": {"rate_limit": "1/h"}}):
        found = load_option_targets()
        assert found == ["tests.testapp.tasks.add", "tests.testapp.tasks.add_async"]
        limits = in_force(all_handlers(tasks=True))
        assert limits.jobs["tests.testapp.tasks.add"] == Rate(1, 3600)
        results = [tasks.add.enqueue(n, n) for n in range(3)]
        worker = WorkerFactory()
        # A claim under the worker's limits admits one run in the hour.
        claimed = claiming.claim_batch(worker.pk, None, 10, limits=limits)
        assert [claim.run_id for claim in claimed] == [run_id(results[0].id)]
        assert claiming.claim_batch(worker.pk, None, 10, limits=limits) == []
        assert JobRun.objects.filter(hold=Hold.RATE).count() == 2


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], []),  # E001 says so
        ({"": {}}, ["a key is a job type or pattern"]),
        ({"x": "pool"}, ["must be a dict of options"]),
        ({"x": {"pool": "a b"}}, ["pool 'a b'"]),
        ({"x": {"queue": "a"}}, ["unknown options queue"]),
        ({"x": {"priority": 10**6}}, ["priority must be a whole number"]),
        ({"x": {"retry": {"attempts": 0}}}, ["attempts"]),
        ({"x": {"retry": 3}}, ["retry must be a RetryPolicy"]),
        ({"x": {"timeout": -1}}, ["timeout must be positive"]),
        ({"x": {"concurrency_limit": 0}}, ["concurrency_limit"]),
        ({"x": {"rate_limit": "fast"}}, ["rate_limit"]),
        ({"x": {"concurrency_key": "no.such.module.fn"}}, ["cannot be imported"]),
        ({"x": {"concurrency_key": "tests.testapp.keys.not_callable"}}, ["must be a callable"]),
        ({"x": {"rate_limit_key": "tests.testapp.keys.shared"}}, ["needs a 'rate_limit'"]),
        ({"x": {"pool": "p", "concurrency_key": "tests.testapp.keys.shared"}}, []),
    ],
)
def test_the_check_reports_each_problem_in_one_line(entries: Any, expected: list[str]) -> None:
    found = e015(entries)
    assert len(found) == len(expected), found
    for message, part in zip(found, expected, strict=True):
        assert part in message
        assert "\n" not in message


def test_an_invalid_entry_sets_nothing() -> None:
    with options({"tests.echo": {"pool": "a b", "priority": 3}}):
        assert options_for("tests.echo") == {"priority": 3}


def test_the_admin_shows_the_options_in_force() -> None:
    run = start("tests.echo", {})
    with options({"tests.*": {"priority": 3, "pool": "<b>bold</b>"}, "tests.echo": {"timeout": 9}}):
        page = operator().get(f"/admin/django_jobs/jobrun/{run.pk}/change/").content.decode()
    assert "Options from settings" in page
    assert "priority = 3" in page
    assert "timeout = 9" in page
    assert "JOB_OPTIONS[&#x27;tests.echo&#x27;]" in page
    # What settings hold is written escaped.
    assert "<b>bold</b>" not in page


def test_jobstatus_lists_the_keys_and_what_they_apply_to() -> None:
    entries = {"tests.e*": {"priority": 3}, "nothing.*": {"pool": "x"}}
    with options(entries):
        out = StringIO()
        call_command("jobstatus", stdout=out)
        text = out.getvalue()
        out = StringIO()
        call_command("jobstatus", "--json", stdout=out)
        document = json.loads(out.getvalue())
    assert "Options from settings (JOB_OPTIONS)" in text
    assert "  tests.e*: priority=3" in text
    assert "applies to tests.echo" in text
    assert "applies to no job type this process knows" in text
    by_key = {entry["key"]: entry for entry in document["job_options"]}
    assert by_key["tests.e*"]["options"] == {"priority": "3"}
    assert "tests.echo" in by_key["tests.e*"]["job_types"]
    assert by_key["nothing.*"]["job_types"] == []


@pytest.mark.django_db(transaction=True)
def test_a_key_from_settings_holds_under_real_workers(start_worker: Any) -> None:
    """A task one does not own, given a key by its first argument in settings: two
    workers of 4 threads never run two of one key at once."""
    entries = {
        "tests.testapp.tasks.overlapping": {
            "concurrency_key": "tests.testapp.keys.by_first_argument",
        }
    }
    with options(entries):
        results = [tasks.overlapping.enqueue(0.15) for _ in range(8)]
    env = {"DJANGO_JOBS_JOB_OPTIONS": json.dumps(entries)}
    for _ in range(2):
        start_worker("--pool", "default", "--concurrency", "4", **env)
    ids = [run_id(result.id) for result in results]
    wait_until(lambda: JobRun.objects.filter(pk__in=ids, status=Status.COMPLETED).count() == 8, 60)
    spans = sorted(
        Execution.objects.filter(job_type="overlapping").values_list("started_at", "finished_at")
    )
    assert len(spans) == 8
    for (_, finished), (started, _) in itertools.pairwise(spans):
        assert finished <= started
    assert (
        JobRun.objects.filter(pk__in=ids).aggregate(Max("concurrency_limit"))[
            "concurrency_limit__max"
        ]
        == 1
    )


def test_finding_tasks_builds_no_lazy_object() -> None:
    from django.utils.functional import empty

    from django_jobs.task_lookup import loaded_tasks, task_at
    from tests.testapp import keys

    assert "tests.testapp.tasks.add" in loaded_tasks()
    assert task_at("tests.testapp.keys.lazily_failing", importing=False) is None
    assert keys.lazily_failing._wrapped is empty  # never built
