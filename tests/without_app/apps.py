from __future__ import annotations

from django.apps import AppConfig


class WithoutAppConfig(AppConfig):
    name = "tests.without_app"

    def ready(self) -> None:
        # As many apps do (signal receivers, registries): their tasks are imported
        # at startup, and with them the tasks framework and the backend.
        from . import tasks  # noqa: F401
