"""The worker's burst log handler: every line written, in order, soon."""

from __future__ import annotations

import io
import logging
import time

from django_jobs.logstream import BurstHandler


def make_logger(handler: logging.Handler) -> logging.Logger:
    log = logging.getLogger(f"tests.logstream.{id(handler)}")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    return log


def test_info_lines_are_written_together_within_the_flush_delay() -> None:
    stream = io.StringIO()
    log = make_logger(BurstHandler(stream, flush_after=0.05))
    log.info("run=%s outcome=completed", 1)
    log.info("run=%s outcome=completed", 2)
    assert stream.getvalue() == ""
    deadline = time.monotonic() + 5
    while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = stream.getvalue().splitlines()
    assert [line.split(" INFO ")[1] for line in lines] == [
        f"{log.name} run=1 outcome=completed",
        f"{log.name} run=2 outcome=completed",
    ]


def test_a_warning_is_written_at_once_after_the_lines_before_it() -> None:
    stream = io.StringIO()
    log = make_logger(BurstHandler(stream, flush_after=60))
    log.info("first")
    log.warning("second")
    assert [line.rsplit(" ", 1)[1] for line in stream.getvalue().splitlines()] == [
        "first",
        "second",
    ]


def test_close_writes_what_is_kept() -> None:
    stream = io.StringIO()
    handler = BurstHandler(stream, flush_after=60)
    make_logger(handler).info("last words")
    handler.close()
    assert stream.getvalue().endswith("last words\n")
