"""SQLite: the portable forms, with SQLite's JSON functions for the attempts' workers."""

from __future__ import annotations

from typing import Any

from .base import Vendor


class SQLite(Vendor):
    def worker_ids(
        self, column: str, params: list[Any], worker_id: str | None
    ) -> tuple[str, list[Any]]:
        if worker_id is None:
            return f"json_remove({column}, '$[#-1]')", params
        return f"json_insert({column}, '$[#]', %s)", [*params, worker_id]
