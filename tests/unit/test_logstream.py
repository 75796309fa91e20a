"""The worker's burst log handler: every line written, in order, soon."""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable, Iterator

import pytest

from django_jobs.errors import MAX_ERROR_MESSAGE, MAX_TRACEBACK
from django_jobs.logstream import (
    MAX_LINE,
    BurstHandler,
    SafeTracebacks,
    outcome_line_follows,
    outcome_line_to_follow,
    write_worker_log,
)


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


# --- what a run's exception can put in the log ------------------------------------

RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
FORGED = "\n2026-12-05 07:00:00,000 INFO django_jobs.execution run=9 outcome=completed\n"


def logged(error: BaseException, formatter: logging.Formatter | None = None) -> str:
    """What the worker's handler (or a plain one with ``formatter``) writes for a
    failure logged as the run outcomes are, with ``exc_info``."""
    stream = io.StringIO()
    handler: logging.Handler
    if formatter is None:
        handler = BurstHandler(stream, flush_after=60)
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
    log = make_logger(handler)
    if formatter is not None:
        log.addFilter(SafeTracebacks())
    log.error("run=%s outcome=failed message=%r", 7, str(error), exc_info=error)
    handler.close()
    return stream.getvalue()


def records(text: str) -> list[str]:
    return [line for line in text.splitlines() if RECORD.match(line)]


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def chained() -> BaseException:
    try:
        try:
            raise KeyError("inner" + FORGED)
        except KeyError as inner:
            raise RuntimeError("outer" + FORGED) from inner
    except RuntimeError as outer:
        return outer


def noted() -> BaseException:
    error = ValueError("with a note")
    error.add_note("note" + FORGED)
    return raised(error)


def syntax() -> BaseException:
    return raised(SyntaxError("bad input", ("form.py", 1, 1, "line" + FORGED, 1, 2)))


def grouped() -> BaseException:
    return raised(ExceptionGroup("several" + FORGED, [ValueError("member" + FORGED)]))


@pytest.mark.parametrize(
    "make",
    [lambda: raised(ValueError("boom" + FORGED)), chained, noted, syntax, grouped],
    ids=["message", "chain", "note", "syntax error", "group"],
)
@pytest.mark.parametrize("handler", ["worker's own", "a plain Formatter"])
def test_an_exception_message_adds_no_line_that_reads_like_a_record(
    make: Callable[[], BaseException], handler: str
) -> None:
    formatter = (
        None
        if handler == "worker's own"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    text = logged(make(), formatter)
    assert len(records(text)) == 1, text
    assert "Traceback (most recent call last):" in text
    # The forged line is still there to read, escaped inside its record.
    assert "\\n2026-12-05 07:00:00,000 INFO" in text


def test_a_huge_message_is_cut_in_the_line_and_in_the_traceback() -> None:
    text = logged(raised(ValueError("y" * 10_000_000)))
    assert len(text) < 3 * MAX_ERROR_MESSAGE + MAX_TRACEBACK
    assert len(records(text)) == 1
    assert "characters" in records(text)[0]  # says it was cut
    assert text.count("y") > MAX_ERROR_MESSAGE // 2  # the start of it is there


def test_a_long_traceback_keeps_both_ends() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("the failing line")
        deep(n - 1)

    error = None
    try:
        deep(900)
    except ValueError as caught:
        error = caught
    assert error is not None
    text = logged(error)
    assert len(text) < MAX_LINE + MAX_TRACEBACK + 500
    assert "Traceback (most recent call last):" in text
    assert text.rstrip().endswith("ValueError: the failing line")


# --- the worker's log, beside the other handlers of the process --------------------


@pytest.fixture
def bare_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Called in a test: no handler on the root logger (pytest's own taken off) nor on
    django_jobs' loggers, as in a project without LOGGING. The record factory and
    the handlers are put back after."""

    def bare() -> None:
        monkeypatch.setattr(logging.getLogger(), "handlers", [])
        for name, each in list(logging.Logger.manager.loggerDict.items()):
            if isinstance(each, logging.Logger) and (name + ".").startswith("django_jobs."):
                monkeypatch.setattr(each, "handlers", [])
                monkeypatch.setattr(each, "propagate", True)

    factory = logging.getLogRecordFactory()
    yield bare
    logging.setLogRecordFactory(factory)


def test_kept_lines_are_written_before_another_logger_writes(
    bare_logging: Callable[[], None],
) -> None:
    bare_logging()
    stream = io.StringIO()
    handler = write_worker_log(stream)
    assert handler is not None
    ours = logging.getLogger("django_jobs.tests.order")
    ours.setLevel(logging.INFO)
    other = make_logger(logging.StreamHandler(stream))  # writes at once, as Django's console
    ours.info("first")
    ours.info("second")
    other.info("third")
    ours.info("fourth")
    handler.close()
    said = [line.rsplit(" ", 1)[-1] for line in stream.getvalue().splitlines()]
    assert said == ["first", "second", "third", "fourth"]


@pytest.mark.parametrize(
    "configure",
    [
        lambda: logging.getLogger().addHandler(logging.NullHandler()),
        lambda: logging.getLogger("django_jobs").addHandler(logging.NullHandler()),
        lambda: logging.getLogger("django_jobs.execution").addHandler(logging.NullHandler()),
        lambda: setattr(logging.getLogger("django_jobs"), "propagate", False),
    ],
    ids=["root", "django_jobs", "a logger below it", "django_jobs silenced"],
)
def test_a_logging_of_the_project_own_gets_no_handler_added(
    bare_logging: Callable[[], None], configure: Callable[[], None]
) -> None:
    bare_logging()
    configure()
    factory = logging.getLogRecordFactory()
    assert write_worker_log(io.StringIO()) is None
    assert logging.getLogRecordFactory() is factory


def test_the_outcome_line_to_follow_is_the_innermost() -> None:
    assert outcome_line_to_follow() is None
    with outcome_line_follows(1):
        with outcome_line_follows(2):
            assert outcome_line_to_follow() == 2
        assert outcome_line_to_follow() == 1
    assert outcome_line_to_follow() is None
