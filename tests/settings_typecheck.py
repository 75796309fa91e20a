"""Settings for mypy's django-stubs plugin: never start a database server."""

from __future__ import annotations

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@localhost/typecheck")

from tests.settings import *  # noqa: F403
