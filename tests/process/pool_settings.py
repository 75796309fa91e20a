"""The test settings on Django's own connection pool, at psycopg_pool's default size
(at most 4 connections): for the worker subprocesses of test_connection_pool."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES["default"].setdefault("OPTIONS", {})["pool"] = True
