"""Finding ``django.tasks`` tasks by name: the one guard for names read from rows.

A run's job type, a schedule's target and a key of ``JOB_OPTIONS`` name a task
by its module path. ``task_at`` finds it without importing anything outside
the installed apps; ``loaded_tasks`` lists those this process has imported.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

from django.apps import apps

from .tasks_compat import Task

if TYPE_CHECKING:
    AnyTask = Task[..., Any]


def loaded_tasks() -> list[str]:
    """The module paths of the tasks defined in the installed apps' modules this
    process has imported (nothing is imported here)."""
    paths = set()
    for name, module in list(sys.modules.items()):
        if module is None or not _in_installed_app(name):
            continue
        for value in list(vars(module).values()):
            # type(), not isinstance(): isinstance() reads a lazy object's
            # __class__, which builds it (a storage, a client), maybe failing.
            if issubclass(type(value), Task) and value.module_path.rpartition(".")[0] == name:
                paths.add(value.module_path)
    return sorted(paths)


def task_at(path: str, *, importing: bool) -> AnyTask | None:
    """The ``Task`` a stored name designates, or None: the one guard for every name
    read from a row (a run's job type, a schedule's target) or from settings.

    Nothing outside the installed apps is imported: a module is imported only
    when ``importing`` and it belongs to an installed app's package; otherwise
    it must be imported already. The task is read from the module's own
    ``__dict__``, never through attribute access, which a module's
    ``__getattr__`` may turn into an import. It must be a ``Task`` defined at
    that very path (a forged ``os.system`` or ``django_jobs.testing`` finds none).
    """
    module_name, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    if not name.isidentifier() or not all(p.isidentifier() for p in module_name.split(".")):
        return None
    module = sys.modules.get(module_name)
    if module is None:
        if not importing or not _in_installed_app(module_name):
            return None
        try:
            module = import_module(module_name)
        except ImportError:
            return None
    task: Any = vars(module).get(name)
    if not issubclass(type(task), Task) or task.module_path != path:
        return None
    return task  # type: ignore[no-any-return]


def _in_installed_app(module: str) -> bool:
    return any(
        module == config.name or module.startswith(config.name + ".")
        for config in apps.get_app_configs()
    )
