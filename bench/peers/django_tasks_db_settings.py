"""Django settings for the django-tasks-db side of the benchmark (Django 6.1's tasks
framework with django-tasks-db's database backend)."""

from __future__ import annotations

import os

SECRET_KEY = "django-tasks-db-bench"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["BENCH_DB"],
        "HOST": os.environ.get("BENCH_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_PGPORT", "5432"),
        "USER": os.environ.get("BENCH_PGUSER", "postgres"),
        # Persistent connections: with Django's default (0) db_worker reconnects for
        # every task and drains about half as fast.
        "CONN_MAX_AGE": 600,
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
