"""The worker's own log handler: one line per run, written in bursts.

``runjobworker`` logs one line per run outcome. At thousands of runs a second
a ``write()`` and a ``strftime()`` per line cost a large part of a short run,
so this handler keeps lines for at most ``flush_after`` seconds and writes
them together; warnings and errors are written at once (with everything
before them, so the order holds). Only used when the project's ``LOGGING``
does not configure the ``django_jobs`` logger or the root logger.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TextIO

from .payloads import terminal_safe


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

    def formatMessage(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().formatMessage(record))

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        # A traceback's own line breaks stay; each of its lines is escaped.
        lines = super().formatException(ei).split("\n")
        return "\n".join(terminal_safe(line) for line in lines)


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
