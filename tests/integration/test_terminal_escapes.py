"""Terminal escapes (issue 16, finding 6): what the commands print is shown, never obeyed.

Rows are written with the ORM, past every check, as a row written before the
checks existed or by hand would be: the commands escape what they print
whatever validated it on the way in. Reasons are checked where they are given.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobs import cancel, start
from django_jobs.exceptions import InvalidJobInput
from django_jobs.models import JobPool, JobRun
from django_jobs.pools import pause_pool, paused_pools
from tests.factories import JobRunFactory, RunningJobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db

# Retitles the terminal, clears it, turns red, and forges a line of the listing.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[1;31mFAKE\nall pools healthy\u202e"
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\x1b[1;31mFAKE\\nall pools healthy\\u202e"
REFUSED = ["\x1b[2J", "a\nb", "bell\x07", "\u202eright to left", "a\x00b"]


def output(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_jobstatus_shows_each_stored_text_escaped_on_its_own_line() -> None:
    pool = f"q{HOSTILE}"
    JobPool.objects.create(name=pool, paused_at=timezone.now(), pause_reason=HOSTILE)
    JobRunFactory(pool=pool)
    worker = WorkerFactory(hostname=f"h{HOSTILE}", pools=[pool])
    RunningJobRunFactory(
        job_type=f"t{HOSTILE}",
        pool=pool,
        claimed_by=worker,
        progress={"done": 1, "total": 2, "message": HOSTILE},
    )
    text = output("jobstatus")
    assert [c for c in text if c in "\x1b\x07\u202e"] == []
    assert "all pools healthy" not in [line.strip() for line in text.splitlines()]
    assert f"q{SHOWN} paused for " in text  # the pool and its reason
    assert f": {SHOWN}\n" in text
    assert f"h{SHOWN}:" in text  # the worker, host:pid
    assert f"t{SHOWN} (q{SHOWN})" in text  # the running run's job type and pool


def test_jobpool_list_shows_a_stored_newline_escaped() -> None:
    JobPool.objects.create(name="mail", paused_at=timezone.now(), pause_reason=HOSTILE)
    [line] = output("jobpool", "list").splitlines()
    assert line.startswith("mail paused since ")
    assert line.endswith(f": {SHOWN}")


@pytest.mark.parametrize("reason", REFUSED)
def test_a_pause_reason_with_a_control_character_is_refused_saying_which(reason: str) -> None:
    where = r"contains a control character \(\\.+ at position \d+\); write it as one line"
    with pytest.raises(ValueError, match=f"pause reason {where}"):
        pause_pool("mail", reason=reason)
    with pytest.raises(CommandError, match=f"the reason {where}"):
        call_command("jobpool", "pause", "mail", "--reason", reason)
    assert paused_pools() == {}


@pytest.mark.parametrize("reason", REFUSED[:-1])  # NUL has its own message, as in every text
def test_a_cancel_reason_with_a_control_character_is_refused_saying_which(reason: str) -> None:
    run = start("tests.noop", {})
    with pytest.raises(InvalidJobInput, match=r"reason contains a control character \(\\"):
        cancel(run.pk, reason=reason)
    assert JobRun.objects.get(pk=run.pk).status == "pending"


def test_reasons_may_use_the_spaces_of_any_script() -> None:
    french = "SMTP en panne\u00a0: réessayer à 14\u202fh"  # no-break spaces, as typed in French
    japanese = "メール\u3000停止中"
    assert pause_pool("mail", reason=french)
    assert output("jobpool", "list").rstrip("\n").endswith(f": {french}")
    run = start("tests.noop", {})
    assert cancel(run.pk, reason=japanese) == 1
    assert JobRun.objects.get(pk=run.pk).cancel_reason == japanese
