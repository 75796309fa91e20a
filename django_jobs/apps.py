from __future__ import annotations

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    verbose_name = _("Jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .registry import add_resolver, autodiscover
        from .schedules import add_target_lookup

        autodiscover()
        try:
            from .tasks_backend import resolve_task, schedule_target
        except ImproperlyConfigured:
            pass  # no tasks framework installed: django.tasks runs are not served
        else:
            add_resolver(resolve_task)
            add_target_lookup(schedule_target)
