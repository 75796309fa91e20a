"""The import rule of django_jobs: a module imports from its own layer and the layers below.

The layers, lowest first, are described in docs/architecture.md. Imports made
only for type checking (under ``if TYPE_CHECKING:``) do not count; imports inside
functions do. The upward imports allowed are ``JobHandler.start`` (and
``start_many``) calling the API, and ``JobRun.wait`` (and ``await_result``)
calling the results service, lazily.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import django_jobs

PACKAGE = Path(django_jobs.__file__).parent

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundations",
        frozenset(
            {
                "conf",
                "exceptions",
                "signals",
                "payloads",
                "backoff",
                "cron",
                "schedules",
                "names",
                "errors",
                "logstream",
                "tracing",
                "tasks_compat",
                "task_lookup",
                "ratelimits",
                "embedded",
                "joboptions",
                "states",
            }
        ),
    ),
    ("definitions", frozenset({"models", "registry", "migrations"})),
    ("storage", frozenset({"storage"})),
    ("transitions", frozenset({"transitions", "waking", "locking"})),
    (
        "services",
        frozenset(
            {
                "api",
                "building",
                "events",
                "results",
                "debounce",
                "handling",
                "inline",
                "attempt",
                "context",
                "acontext",
                "execution",
                "completer",
                "claimer",
                "overdue",
                "eventloop",
                "scheduler",
                "schedule_rows",
                "schedule_api",
                "schedule_targets",
                "retention",
                "snapshot",
                "pools",
                "health",
            }
        ),
    ),
    (
        "entry points",
        frozenset(
            {
                "",  # the package itself: django_jobs/__init__.py
                "worker",
                "vitals",
                "watchman",
                "testing",
                "tasks_backend",
                "metrics",
                "admin",
                "management",
                "checks",
                "apps",
            }
        ),
    ),
)

# (importer, imported): JobHandler.start and start_many enqueue through the API;
# JobRun.wait and await_result wait through the results service.
ALLOWED = frozenset(
    {("django_jobs.registry", "django_jobs.api"), ("django_jobs.models", "django_jobs.results")}
)


def module_name(path: Path) -> str:
    parts = ["django_jobs", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The index in LAYERS of a django_jobs module; KeyError when it has none."""
    top = module.split(".")[1] if "." in module else ""
    for index, (_, names) in enumerate(LAYERS):
        if top in names:
            return index
    raise KeyError(module)


def sources() -> dict[str, str]:
    return {module_name(path): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node``, except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _walk(other)
            continue
        yield child
        yield from _walk(child)


def imports(module: str, source: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """The django_jobs modules ``module`` imports, with the line of each import."""
    package = module if is_package else module.rpartition(".")[0]
    for node in _walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "django_jobs":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "django_jobs":
                continue
            for alias in node.names:
                # ``from . import api`` imports the module django_jobs.api.
                yield (f"{target}.{alias.name}" if target == "django_jobs" else target), node.lineno


def violations(found: dict[str, str]) -> list[str]:
    """One line per import of a higher layer than the importer's."""
    problems = []
    for module, source in found.items():
        is_package = (PACKAGE / Path(*module.split(".")[1:]) / "__init__.py").exists()
        own = layer_of(module)
        for target, line in imports(module, source, is_package):
            if (module, target) in ALLOWED or target == "django_jobs":
                continue
            if layer_of(target) > own:
                problems.append(
                    f"{module}:{line} imports {target} "
                    f"({LAYERS[own][0]} may not import {LAYERS[layer_of(target)][0]})"
                )
    return problems


def test_every_module_belongs_to_a_layer() -> None:
    for module in sources():
        layer_of(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert violations(sources()) == []


def test_an_upward_import_is_caught() -> None:
    # The rule is not vacuous: a storage module reaching up to the API, a
    # transition reaching up to the worker, and a foundation reaching models all fail.
    planted = sources()
    planted["django_jobs.storage.leases"] += "\n\ndef f():\n    from .. import api\n"
    planted["django_jobs.transitions"] += "\nfrom django_jobs.worker import JobWorker\n"
    planted["django_jobs.payloads"] += "\nfrom .models import JobRun\n"
    found = violations(planted)
    assert len(found) == 3, found
    assert any(line.startswith("django_jobs.storage.leases:") for line in found)
    assert any("imports django_jobs.worker" in line for line in found)
    assert any("foundations may not import definitions" in line for line in found)


def test_type_checking_imports_do_not_count() -> None:
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .worker import JobWorker\n"
    )
    assert violations({"django_jobs.payloads": source}) == []
