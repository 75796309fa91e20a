"""The statements that differ per database, behind one interface, with a module per vendor.

Everything else in ``storage`` is written once, with the ORM or portable SQL.
What a database does its own way is a method of ``Vendor`` (``base.py``, where the
portable forms live); ``postgresql.py``, ``mysql.py`` (MySQL and MariaDB) and
``sqlite.py`` override what they do
differently. A new database is one more module here and one more line in
``_VENDORS``; outside this package, only the system checks and the first
migration ask which database they are talking to.
"""

from __future__ import annotations

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import Vendor
from .mysql import MySQL
from .postgresql import PostgreSQL
from .sqlite import SQLite

_VENDORS: dict[str, Vendor] = {
    "postgresql": PostgreSQL(),
    "mysql": MySQL(),  # and MariaDB
    "sqlite": SQLite(),
}
_PORTABLE = Vendor()


def of(connection: BaseDatabaseWrapper) -> Vendor:
    """The vendor of ``connection`` (the portable forms for a database not listed)."""
    return _VENDORS.get(connection.vendor, _PORTABLE)


def of_alias(alias: str) -> Vendor:
    """The vendor of database ``alias``."""
    return of(connections[alias])


__all__ = ["Vendor", "of", "of_alias"]
