"""The worker's own log handler: one line per run, written in bursts, in order.

``runjobworker`` logs one line per run outcome. At thousands of runs a second
a ``write()`` and a ``strftime()`` per line cost a large part of a short run,
so this handler keeps lines for at most ``flush_after`` seconds and writes
them together; warnings and errors are written at once (with everything
before them, so the order holds), and so is what it keeps before any other
logger's record is made (``write_worker_log``). Only used when the project's
``LOGGING`` configures neither a ``django_jobs`` logger nor the root logger.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import traceback
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, TextIO

from .errors import MAX_ERROR_MESSAGE, MAX_TRACEBACK, clip, safely
from .payloads import terminal_safe

# The loggers of django_jobs: this one and those below it.
LOGGER = "django_jobs"

# The most characters of one record's own line (its message, escaped): a run's
# error message is stored cut at MAX_ERROR_MESSAGE, and its log line is cut alike.
MAX_LINE = 2 * MAX_ERROR_MESSAGE

# The lines of a Python traceback that start at the margin; any other line of a
# record's traceback that does (a message's own line break, a SyntaxError's
# text) is indented, so that it cannot read like a record of its own. A record
# starts with its time, a digit; none of these can.
_MARGIN_LINES = re.compile(
    r"Traceback \(most recent call last\):"
    r"|During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:"
    r"|[A-Za-z_][\w.]*(: .*)?"
)


class LineFormatter(logging.Formatter):
    """``asctime levelname name message``, with the time text made once per second.

    A line may quote what a caller filled (a job type, an error message raised
    over a hostile input): its control characters are written as escapes, so
    that no run can drive the terminal or forge a line of the worker's log.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        # A traceback another formatter wrote first (and left on the record) is
        # not reused: it may hold the line breaks this one escapes.
        if record.exc_info:
            record.exc_text = None
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record), MAX_LINE)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return exception_text(ei)


class SafeTracebacks(logging.Filter):
    """Give each record with an exception the traceback ``exception_text`` writes.

    On a logger whose records carry a handler's exception (the run outcomes'):
    a ``logging.Formatter`` of the project's own ``LOGGING`` then writes that
    traceback too (it writes ``record.exc_text`` when set), so a run's exception
    message adds no line to any log made of formatted text. ``exc_info`` stays,
    for the error trackers that read the exception itself.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = exception_text(record.exc_info)
        return True


def one_line(text: str, limit: int) -> str:
    """``text`` as one line of at most about ``limit`` characters, control
    characters (line breaks included) written as escapes."""
    text = terminal_safe(text[: limit + 1])
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]} … [cut at {limit:,} characters]"


def exception_text(ei: logging._SysExcInfoType) -> str:
    """The traceback of ``ei`` as lines a log may hold: bounded, escaped, and with
    no line that could be taken for a record.

    Every message of the exception's chain (its notes, a SyntaxError's text) is
    written on its own line, its line breaks escaped and its length cut at
    ``MAX_ERROR_MESSAGE``, as in the stored error; the whole is cut at
    ``MAX_TRACEBACK``, keeping both ends, as the stored traceback is.
    """
    kind, error, trace = ei
    text = "".join(traceback.format_exception(kind, error, trace))
    if error is not None:
        for message in sorted(set(_messages(error)), key=len, reverse=True):
            text = text.replace(message, one_line(message, MAX_ERROR_MESSAGE))
    text = clip(text.rstrip("\n"), MAX_TRACEBACK, tail=MAX_TRACEBACK * 4 // 5)
    lines = text.split("\n")
    return "\n".join(
        terminal_safe(
            line
            if not line or line[0].isspace() or _MARGIN_LINES.fullmatch(line)
            else f"    {line}"
        )
        for line in lines
    )


def _messages(error: BaseException) -> Iterator[str]:
    """The texts an exception's traceback quotes from its exceptions (messages,
    notes, a SyntaxError's line), down its chain and groups, when they are long
    or span lines: what a caller's data may fill."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        texts = [safely(lambda e=current: str(e), type(current))]  # type: ignore[misc]
        texts += [n for n in getattr(current, "__notes__", None) or () if isinstance(n, str)]
        if isinstance(current, SyntaxError):
            texts += [t for t in (current.text, current.filename) if isinstance(t, str)]
        yield from (t for t in texts if "\n" in t or "\r" in t or len(t) > MAX_ERROR_MESSAGE)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += [e for e in getattr(current, "exceptions", ()) if isinstance(e, BaseException)]


class BurstHandler(logging.Handler):
    """Write formatted lines to ``stream`` in bursts at most ``flush_after`` seconds old."""

    def __init__(self, stream: TextIO, flush_after: float = 0.2) -> None:
        super().__init__()
        self.stream = stream
        self.flush_after = flush_after
        self._lines: list[str] = []
        self._timer: threading.Timer | None = None
        self.setFormatter(LineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        # Called with self.lock held (Handler.handle), so formatting is serialized.
        try:
            self._lines.append(self.format(record))
        except Exception:
            self.handleError(record)
            return
        if record.levelno >= logging.WARNING:
            self._write()
        elif self._timer is None:
            self._timer = threading.Timer(self.flush_after, self.flush)
            self._timer.daemon = True
            self._timer.start()

    @property
    def keeps_lines(self) -> bool:
        """Whether lines are kept, not yet written (read without the lock: a hint)."""
        return bool(self._lines)

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def close(self) -> None:
        self.flush()
        super().close()

    def _write(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lines:
            text = "\n".join(self._lines) + "\n"
            self._lines.clear()
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must not break the worker


# --- the worker's log, when the project's LOGGING sets none ----------------------------


def write_worker_log(stream: TextIO) -> BurstHandler | None:
    """Send django_jobs' records to ``stream`` (a ``BurstHandler`` on the ``django_jobs``
    logger), unless the project's ``LOGGING`` configures the root logger or a
    ``django_jobs`` logger (then it decides where they go); the handler added, if any.

    Other handlers write to the same stream at once (Django's console handler,
    Python's last resort for a logger without one): what this one keeps is
    written before any other logger's record is made, so their lines never
    overtake its own.
    """
    if logging.getLogger().handlers or _configured():
        return None
    handler = BurstHandler(stream)
    logging.getLogger(LOGGER).addHandler(handler)
    make_record = logging.getLogRecordFactory()

    def record_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if handler.keeps_lines and not _ours(record.name):
            handler.flush()
        return record

    logging.setLogRecordFactory(record_factory)
    return handler


def _ours(name: str) -> bool:
    return name == LOGGER or name.startswith(f"{LOGGER}.")


def _configured() -> bool:
    """Whether a ``django_jobs`` logger has handlers, or sends nothing up to its parent."""
    loggers = list(logging.Logger.manager.loggerDict.items())
    return any(
        isinstance(each, logging.Logger) and (each.handlers or not each.propagate)
        for name, each in loggers
        if _ours(name)
    )


# --- one line per outcome ------------------------------------------------------------

# The run whose outcome line this thread (or task) writes once its end is written and
# announced (``execution.record``): another line telling that end is a duplicate.
_outcome_line: ContextVar[int | None] = ContextVar("django_jobs_outcome_line", default=None)


class outcome_line_follows:
    """Say, while the body runs, that django_jobs logs the outcome of run ``run_id``.

    A class rather than ``@contextmanager``: it is entered once per run, and a
    generator's context manager costs several times more.
    """

    __slots__ = ("run_id", "token")

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

    def __enter__(self) -> None:
        self.token = _outcome_line.set(self.run_id)

    def __exit__(self, *exc: object) -> None:
        _outcome_line.reset(self.token)


def outcome_line_to_follow() -> int | None:
    """The run whose outcome line django_jobs is about to write here, if any."""
    return _outcome_line.get()
