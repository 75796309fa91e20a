"""Settings of the benchmark project: the jobs database from BENCH_DATABASE_URL."""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-jobs-bench"
USE_TZ = True
INSTALLED_APPS = ["django_jobs", "project.benchapp"]
DATABASES = {"default": environ.Env.db_url_config(os.environ["BENCH_DATABASE_URL"])}
DATABASES["default"]["CONN_MAX_AGE"] = None
_engine = DATABASES["default"]["ENGINE"]
if _engine == "django.db.backends.mysql":
    # django_jobs needs the session clock in UTC on MariaDB/MySQL (its system check says so).
    DATABASES["default"]["OPTIONS"] = {"init_command": "SET time_zone = '+00:00'"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DJANGO_JOBS = {
    "LISTEN_NOTIFY": os.environ.get("BENCH_LISTEN_NOTIFY", "1") == "1",
}
# PostgreSQL: 1 s, a fallback behind LISTEN. Elsewhere unset unless given, so the
# worker polls at its default for a database without LISTEN (0.2 s on MariaDB).
if "postgresql" in _engine or "BENCH_POLL_INTERVAL" in os.environ:
    DJANGO_JOBS["POLL_INTERVAL"] = float(os.environ.get("BENCH_POLL_INTERVAL", "1.0"))
if os.environ.get("BENCH_FAIR_TURNS"):
    DJANGO_JOBS["FAIR_TURNS"] = os.environ["BENCH_FAIR_TURNS"] == "1"
if os.environ.get("BENCH_TENANT_CONCURRENCY"):
    DJANGO_JOBS["TENANT_CONCURRENCY"] = int(os.environ["BENCH_TENANT_CONCURRENCY"])
LOGGING_CONFIG = None
