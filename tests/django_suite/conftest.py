"""Print how much of Django's tasks suite ran unchanged against JobsBackend."""

from __future__ import annotations

import sys
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    module = sys.modules.get("tests.django_suite.test_django_tasks")
    if module is None or not hasattr(module, "counts"):
        return
    unchanged, adapted = module.counts()
    terminalreporter.write_line(
        f"Django's tests/tasks on JobsBackend: {unchanged} unchanged, {adapted} adapted"
    )
