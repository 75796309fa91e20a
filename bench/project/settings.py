"""Settings of the benchmark project: the jobs database from BENCH_DATABASE_URL."""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-jobs-bench"
USE_TZ = True
INSTALLED_APPS = ["django_jobs", "project.benchapp"]
DATABASES = {"default": environ.Env.db_url_config(os.environ["BENCH_DATABASE_URL"])}
DATABASES["default"]["CONN_MAX_AGE"] = None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DJANGO_JOBS = {
    "POLL_INTERVAL": float(os.environ.get("BENCH_POLL_INTERVAL", "1.0")),
    "LISTEN_NOTIFY": os.environ.get("BENCH_LISTEN_NOTIFY", "1") == "1",
}
LOGGING_CONFIG = None
