"""Django settings for the django-tasks-db side of the benchmark (Django 6.1's tasks
framework with django-tasks-db's database backend)."""

from __future__ import annotations

import os

from servers import django_database

SECRET_KEY = "django-tasks-db-bench"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        # PostgreSQL, or MariaDB with BENCH_DATABASE=mariadb (see servers.py).
        **django_database(os.environ["BENCH_DB"]),
        # Persistent connections: with Django's default (0) db_worker reconnects for
        # every task and drains about half as fast.
        "CONN_MAX_AGE": 600,
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
