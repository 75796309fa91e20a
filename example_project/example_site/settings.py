"""Settings of the example project, read from the environment with django-environ.

``DATABASE_URL`` names the PostgreSQL database. When it is unset, an embedded
PostgreSQL server is started for this process (and exported as ``DATABASE_URL``
so the worker subprocesses that ``rundemo`` starts share it); it is deleted on exit.
"""

from __future__ import annotations

from pathlib import Path

import environ

from django_jobs.embedded import database_url

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1"]),
)

SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-example-project-only")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobs",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_site.urls"
WSGI_APPLICATION = "example_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# database_url() returns $DATABASE_URL, or starts an embedded server and returns its URL.
DATABASES = {"default": environ.Env.db_url_config(database_url())}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DJANGO_JOBS = {
    # The demo's retries back off for tens of milliseconds: poll often.
    "POLL_INTERVAL": env.float("DJANGO_JOBS_POLL_INTERVAL", default=0.2),
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
