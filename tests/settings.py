"""Settings for the test suite: PostgreSQL from DATABASE_URL, or an embedded server."""

from __future__ import annotations

import json
import os
from typing import Any

import django
import environ

from django_jobs.embedded import database_url

SECRET_KEY = "django-jobs-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobs",
    "tests.testapp",
    # A third-party app's @task code, run as it is (tests/process/test_third_party_tasks.py).
    "modelsearch",
    "tests.searchapp",
]
if django.VERSION < (6, 0):
    # The django.tasks backport, which django_jobs' tasks backend uses on Django 5.2.
    INSTALLED_APPS.append("django_tasks")

# @task functions (tests/testapp/tasks.py) run on django_jobs; any queue name is valid.
TASKS = {"default": {"BACKEND": "django_jobs.tasks_backend.JobsBackend", "QUEUES": []}}


def sqlite_file(name: str, transaction_mode: str = "IMMEDIATE") -> dict[str, Any]:
    """A SQLite file database, with the OPTIONS docs/installation.md asks for
    (``transaction_mode=""``: Django's default, as a project that has not set it)."""
    options = {"transaction_mode": transaction_mode} if transaction_mode else {}
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": name, "OPTIONS": options}


if os.environ.get("DJANGO_JOBS_SQLITE"):
    # Worker subprocesses of tests/process/test_sqlite_worker.py: the whole
    # project on one SQLite file, as in development.
    _db = sqlite_file(
        os.environ["DJANGO_JOBS_SQLITE"], os.environ.get("DJANGO_JOBS_SQLITE_MODE", "IMMEDIATE")
    )
else:
    _db = environ.Env.db_url_config(database_url())
    # One test database per pytest process, so two suites on one server never collide.
    _db["TEST"] = {"NAME": os.environ.get("DJANGO_JOBS_TEST_DB", f"test_django_jobs_{os.getpid()}")}
    # Worker subprocesses started by the process tests connect to the test database
    # the pytest process created; it tells them its name through this variable.
    if os.environ.get("DJANGO_JOBS_USE_DB"):
        _db["NAME"] = os.environ["DJANGO_JOBS_USE_DB"]
    # A name for this process's sessions in pg_stat_activity (the connection count test).
    if os.environ.get("DJANGO_JOBS_APPLICATION_NAME") and "postgresql" in _db["ENGINE"]:
        _db.setdefault("OPTIONS", {})["application_name"] = os.environ[
            "DJANGO_JOBS_APPLICATION_NAME"
        ]
if "postgresql" in _db["ENGINE"]:
    # modelsearch's index on PostgreSQL uses its fields (a check error without it).
    INSTALLED_APPS.append("django.contrib.postgres")
DATABASES = {
    "default": _db,
    # Only for the system check that warns about SQLite; no test writes to it.
    # Its tables are made from the models, not migrated: modelsearch's migrations
    # write their index for the default database's vendor (MariaDB's on SQLite).
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
        "TEST": {"MIGRATE": False},
    },
}

DJANGO_JOBS: dict[str, Any] = {
    "POLL_INTERVAL": float(os.environ.get("DJANGO_JOBS_POLL_INTERVAL", "0.1")),
    "HEARTBEAT_INTERVAL": float(os.environ.get("DJANGO_JOBS_HEARTBEAT_INTERVAL", "1")),
    "STALE_THRESHOLD": float(os.environ.get("DJANGO_JOBS_STALE_THRESHOLD", "3")),
    "SHUTDOWN_TIMEOUT": float(os.environ.get("DJANGO_JOBS_SHUTDOWN_TIMEOUT", "10")),
    "CANCEL_GRACE": float(os.environ.get("DJANGO_JOBS_CANCEL_GRACE", "30")),
    # Off for workers behind PgBouncer 1.18 (test_pgbouncer), which cannot keep them.
    "PREPARED_STATEMENTS": os.environ.get("DJANGO_JOBS_PREPARED_STATEMENTS", "1") == "1",
}
if os.environ.get("DJANGO_JOBS_RETENTION") == "off":
    # Worker subprocesses of test_retention_process that keep every run.
    DJANGO_JOBS["RETENTION"] = None
if os.environ.get("DJANGO_JOBS_TENANT_CONCURRENCY"):
    # Worker subprocesses of the tenant caps' process test (JSON: a cap, or caps by pool).
    DJANGO_JOBS["TENANT_CONCURRENCY"] = json.loads(os.environ["DJANGO_JOBS_TENANT_CONCURRENCY"])
if os.environ.get("DJANGO_JOBS_JOB_OPTIONS"):
    # Worker subprocesses of the JOB_OPTIONS process test (JSON: options by job type).
    DJANGO_JOBS["JOB_OPTIONS"] = json.loads(os.environ["DJANGO_JOBS_JOB_OPTIONS"])

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None
# Fast password hashing: the admin tests create users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
