"""SQLite: the portable forms, with SQLite's JSON functions for the attempts' workers."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .base import Vendor


class SQLite(Vendor):
    limit_hint = "Use PostgreSQL for more than one worker process."

    def unserved(self, connection: BaseDatabaseWrapper) -> str | None:
        return None

    def limit(self, connection: BaseDatabaseWrapper) -> str | None:
        return (
            "is SQLite, which has no row locks: run one worker process only (threads "
            "are fine), or runs may execute twice."
        )

    def worker_ids(
        self, column: str, params: list[Any], worker_id: str | None
    ) -> tuple[str, list[Any]]:
        if worker_id is None:
            return f"json_remove({column}, '$[#-1]')", params
        return f"json_insert({column}, '$[#]', %s)", [*params, worker_id]
