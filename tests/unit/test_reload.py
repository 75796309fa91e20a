"""The reloader's small rules (tests/process/test_reload_process.py runs it for real)."""

from __future__ import annotations

import os

import pytest

from django_jobs.management.reload import PARENT_ENV, exit_status, is_child


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (1, 1), (3, 3), (-9, 137), (-15, 143)])
def test_a_childs_end_is_reported_as_a_shell_would(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


def test_only_the_child_of_the_named_parent_is_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert not is_child()
    monkeypatch.setenv(PARENT_ENV, str(os.getppid()))
    assert is_child()
    # Inherited by a process the child started: its parent is someone else.
    monkeypatch.setenv(PARENT_ENV, str(os.getpid()))
    assert not is_child()
