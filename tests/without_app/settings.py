"""The settings of a project that uses JobsBackend without installing django_jobs.

``TASKS_IMPORTED_AT_START=0``: no app imports its tasks at startup.
"""

from __future__ import annotations

import os

import django

SECRET_KEY = "django-jobs-tests-without-app"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
if os.environ.get("TASKS_IMPORTED_AT_START", "1") == "1":
    INSTALLED_APPS.append("tests.without_app")
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TASKS = {"default": {"BACKEND": "django_jobs.tasks_backend.JobsBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
