"""The test settings with the logging of a new project: Django's default LOGGING
(the ``django`` logger to the console when DEBUG is on), DEBUG from ``LOGS_DEBUG``;
with ``LOGS_ROOT``, a LOGGING of the project's own that gives the root logger a
handler on stdout. For the worker subprocesses of test_logs_process."""

from __future__ import annotations

import os
from typing import Any

from tests.settings import *  # noqa: F403

DEBUG = os.environ.get("LOGS_DEBUG") == "1"
LOGGING_CONFIG = "logging.config.dictConfig"
LOGGING: dict[str, Any] = {}
if os.environ.get("LOGS_ROOT"):
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
        "handlers": {
            "out": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
                "formatter": "plain",
            }
        },
        "root": {"handlers": ["out"], "level": "INFO"},
    }
