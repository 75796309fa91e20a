"""Stored text printed on a terminal, and the check of one-line reasons (no database)."""

from __future__ import annotations

import logging
import sys
from io import StringIO

import pytest

from django_jobs.logstream import BurstHandler
from django_jobs.payloads import control_problem, terminal_safe


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("a\nb\r\tc", "a\\nb\\r\\tc"),
        ("\x00\x07\x7f\x9b", "\\x00\\x07\\x7f\\x9b"),
        ("\u202eevil\u200b", "\\u202eevil\\u200b"),
        ("line\u2028break", "line\\u2028break"),
        ("\ud800", "\\ud800"),
    ],
)
def test_control_characters_are_shown_as_escapes(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown


@pytest.mark.parametrize(
    "text", ["", "SMTP down", "en panne\u00a0: réessayer", "再試行\u3000待ち", "C:\\jobs"]
)
def test_text_and_the_spaces_of_every_script_are_left_alone(text: str) -> None:
    assert terminal_safe(text) == text
    assert control_problem(text) is None


def test_the_problem_names_the_first_control_character_and_where_it_is() -> None:
    assert control_problem("ok\x1b[2J\x07") == (
        "contains a control character (\\x1b at position 2); write it as one line of plain text"
    )


def test_the_worker_log_escapes_what_a_run_put_in_its_lines() -> None:
    """runjobworker's own handler: an error raised over a hostile input reaches stderr."""
    stream = StringIO()
    handler = BurstHandler(stream)
    logger = logging.getLogger("django_jobs.tests.terminal")
    logger.addHandler(handler)
    try:
        raise ValueError("bad email \x1b]0;owned\x07\nFAKE line")
    except ValueError:
        logger.error("run=%s type=%s failed", 7, "t\x1b[2J", exc_info=sys.exc_info())
    finally:
        logger.removeHandler(handler)
        handler.close()
    text = stream.getvalue()
    assert [c for c in text if c in "\x1b\x07"] == []
    assert "run=7 type=t\\x1b[2J failed" in text
    assert "ValueError: bad email \\x1b]0;owned\\x07" in text
    assert text.splitlines()[1] == "Traceback (most recent call last):"
