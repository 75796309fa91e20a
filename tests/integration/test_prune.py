"""``manage.py prunejobs`` and ``retention.prune``: finished runs go in batches, families whole."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobs import retry
from django_jobs.models import JobRun, JobStep, Status
from django_jobs.retention import prune
from tests.factories import JobRunFactory, JobStepFactory

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timezone.now() - timedelta(days=40)


def finished(status: str = Status.COMPLETED, *, at: Any = OLD, **fields: Any) -> JobRun:
    run: JobRun = JobRunFactory(status=status, finished_at=at, **fields)
    return run


def child_of(parent: JobRun, status: str = Status.COMPLETED, **fields: Any) -> JobRun:
    return finished(status, parent=parent, root=parent.root or parent, **fields)


def prunejobs(*args: str) -> str:
    out = StringIO()
    call_command("prunejobs", *args, stdout=out)
    return out.getvalue()


def alive() -> set[int]:
    return set(JobRun.objects.values_list("pk", flat=True))


def test_old_finished_runs_and_their_steps_are_deleted_recent_and_unfinished_kept() -> None:
    old = [finished(status) for status in (Status.COMPLETED, Status.FAILED, Status.CANCELED)]
    JobStepFactory(run=old[0])
    JobStepFactory(run=old[0])
    recent = finished(at=timezone.now() - timedelta(days=2))
    pending = JobRunFactory(created_at=OLD)
    kept_step = JobStepFactory(run=recent)
    out = prunejobs("--older-than", "30d")
    assert out.startswith("Deleted 3 runs and 2 steps (finished over 30d ago, status canceled, ")
    assert alive() == {recent.pk, pending.pk}
    assert list(JobStep.objects.values_list("pk", flat=True)) == [kept_step.pk]


def test_a_family_goes_whole_and_only_once_every_member_has_finished() -> None:
    done = finished()
    # A descendant's own age does not matter: it goes with its root.
    done_child = child_of(done, Status.FAILED, at=timezone.now())
    JobStepFactory(run=child_of(done_child))
    waiting = finished()
    open_child = child_of(waiting, Status.PENDING, at=None)
    result = prune(timedelta(days=30))
    assert (result.runs, result.steps, result.kept_open) == (3, 1, 1)
    assert alive() == {waiting.pk, open_child.pk}


def test_status_filter_selects_top_level_runs_by_their_own_status() -> None:
    failed = finished(Status.FAILED)
    completed = finished(Status.COMPLETED)
    child_of(failed, Status.COMPLETED)
    prunejobs("--status", "failed", "--older-than", "1d")
    assert alive() == {completed.pk}


def test_dry_run_counts_and_deletes_nothing() -> None:
    run = finished()
    JobStepFactory(run=run)
    child_of(run)
    out = prunejobs("--dry-run")
    assert "Would delete 2 runs and 1 steps" in out
    assert JobRun.objects.count() == 2
    assert JobStep.objects.count() == 1


def test_many_batches_each_its_own_transaction() -> None:
    for _ in range(7):
        child_of(finished())
    result = prune(timedelta(days=30), batch_size=2)
    assert (result.runs, result.batches) == (14, 4)
    assert JobRun.objects.count() == 0


def test_a_run_retried_is_no_longer_finished_and_stays() -> None:
    run = finished(Status.FAILED)
    retry(run.pk)
    assert prune(timedelta(days=30)).runs == 0
    assert JobRun.objects.get(pk=run.pk).status == Status.PENDING


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "30"], "expected an age such as 30d"),
        (["--older-than=-3d"], "expected an age such as 30d"),
        (["--older-than", "0d"], "expected an age such as 30d"),
        (["--older-than", "99999999999999999999d"], "expected an age up to 100 years"),
        (["--older-than", "36501d"], "expected an age up to 100 years"),
        (["--status", "pending"], "invalid choice: 'pending'"),
        (["--batch-size", "0"], "expected a positive integer"),
    ],
)
def test_bad_flags_are_refused_before_anything_is_deleted(args: list[str], message: str) -> None:
    run = finished()
    with pytest.raises(CommandError, match=message):
        prunejobs(*args)
    assert alive() == {run.pk}


def test_only_finished_statuses_can_be_pruned() -> None:
    with pytest.raises(ValueError, match="only finished runs"):
        prune(timedelta(days=1), statuses=[Status.RUNNING])
