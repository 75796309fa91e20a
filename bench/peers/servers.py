"""The database server a benchmark runs on: PostgreSQL, or MariaDB with
``BENCH_DATABASE=mariadb`` (``bench/run.py --database mariadb`` sets it).

Every statement the harness itself sends (scratch databases, counts, statistics,
the drain's span) goes through here, so the drivers read the same on both. The
client library is imported on first use: psycopg for PostgreSQL, mysqlclient
(``MySQLdb``) for MariaDB, the driver Django uses there too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Sequence
from typing import Any

DATABASE = os.environ.get("BENCH_DATABASE", "postgresql")
if DATABASE not in ("postgresql", "mariadb"):
    raise SystemExit(f"BENCH_DATABASE must be postgresql or mariadb, not {DATABASE!r}")
POSTGRESQL = DATABASE == "postgresql"

PGHOST = os.environ.get("BENCH_PGHOST", "127.0.0.1")
PGPORT = os.environ.get("BENCH_PGPORT", "5432")
PGUSER = os.environ.get("BENCH_PGUSER", "postgres")
MYHOST = os.environ.get("BENCH_MARIADB_HOST", "127.0.0.1")
MYPORT = os.environ.get("BENCH_MARIADB_PORT", "3306")
MYUSER = os.environ.get("BENCH_MARIADB_USER", "root")
MYPASSWORD = os.environ.get("BENCH_MARIADB_PASSWORD", "")
# The session clock in UTC, as django_jobs requires on MariaDB/MySQL (both systems'
# settings get it, so they run alike).
MARIADB_INIT = "SET time_zone = '+00:00'"

DB_PREFIX = "bench_run_"  # every scratch database of this harness, and nothing else


def dsn(db: str) -> str:
    """psycopg's connection string (PostgreSQL only)."""
    return f"host={PGHOST} port={PGPORT} user={PGUSER} dbname={db}"


def url(db: str) -> str:
    """The database's URL, as django-environ and the PostgreSQL peers read it."""
    if POSTGRESQL:
        return f"postgres://{PGUSER}@{PGHOST}:{PGPORT}/{db}"
    auth = f"{MYUSER}:{MYPASSWORD}" if MYPASSWORD else MYUSER
    return f"mysql://{auth}@{MYHOST}:{MYPORT}/{db}"


def django_database(db: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for ``db`` (without CONN_MAX_AGE)."""
    if POSTGRESQL:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": db,
            "HOST": PGHOST,
            "PORT": PGPORT,
            "USER": PGUSER,
        }
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": db,
        "HOST": MYHOST,
        "PORT": MYPORT,
        "USER": MYUSER,
        "PASSWORD": MYPASSWORD,
        "OPTIONS": {"init_command": MARIADB_INIT},
    }


def connect(db: str | None) -> Any:
    """An autocommit DB-API connection to ``db`` (None: the server's maintenance
    database); use it in a ``with`` block, which closes it."""
    if POSTGRESQL:
        import psycopg

        return psycopg.connect(dsn(db or "postgres"), autocommit=True)
    import MySQLdb

    kwargs = {"database": db} if db else {}
    return MySQLdb.connect(
        host=MYHOST,
        port=int(MYPORT),
        user=MYUSER,
        password=MYPASSWORD,
        autocommit=True,
        init_command=MARIADB_INIT,
        **kwargs,
    )


def recreate_db(db: str) -> None:
    assert db.startswith(DB_PREFIX), db
    with connect(None) as conn:
        cur = conn.cursor()
        if POSTGRESQL:
            cur.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        else:
            _drop_mariadb(cur, db)
        cur.execute(f"CREATE DATABASE {db}")


def drop_scratch_dbs() -> list[str]:
    with connect(None) as conn:
        cur = conn.cursor()
        if POSTGRESQL:
            cur.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [DB_PREFIX + "%"])
        else:
            cur.execute("SHOW DATABASES LIKE %s", [DB_PREFIX.replace("_", "\\_") + "%"])
        names = [row[0] for row in cur.fetchall()]
        for name in names:
            if POSTGRESQL:
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            else:
                _drop_mariadb(cur, name)
    return names


def _drop_mariadb(cur: Any, db: str) -> None:
    """MariaDB's DROP DATABASE has no FORCE: end the sessions still using ``db`` first
    (a session in a transaction would hold a metadata lock the drop waits for)."""
    import MySQLdb

    cur.execute("SELECT id FROM information_schema.processlist WHERE db = %s", [db])
    for (session,) in cur.fetchall():
        with contextlib.suppress(MySQLdb.MySQLError):  # it ended meanwhile
            cur.execute(f"KILL CONNECTION {int(session)}")
    cur.execute(f"DROP DATABASE IF EXISTS {db}")


def scalar(db: str, sql: str, params: Sequence[Any] | None = None) -> Any:
    with connect(db) as conn:
        cur = conn.cursor()
        cur.execute(sql, params)
        row = cur.fetchone() if cur.description else None
        return row[0] if row else None


def analyze(db: str, table: str) -> None:
    """Fresh planner statistics for ``table`` (PostgreSQL also vacuums it)."""
    if POSTGRESQL:
        scalar(db, f"VACUUM ANALYZE {table}")
    else:
        scalar(db, f"ANALYZE TABLE {table}")


def span_seconds(db: str, table: str, where: str) -> float | None:
    """Seconds from the first ``started_at`` to the last ``finished_at`` of ``table``'s
    rows matching ``where``; None when there are none."""
    with connect(db) as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT min(started_at), max(finished_at) FROM {table} WHERE {where}")
        first, last = cur.fetchone()
    if first is None or last is None:
        return None
    span: dt.timedelta = last - first
    return span.total_seconds()


def start_times(db: str, table: str, where: str) -> list[float]:
    """The ``started_at`` of ``table``'s rows matching ``where``, in seconds after the
    first of them, in order (rows not started left out)."""
    with connect(db) as conn:
        cur = conn.cursor()
        cur.execute(
            f"SELECT started_at FROM {table} WHERE {where} AND started_at IS NOT NULL"
            " ORDER BY started_at"
        )
        instants = [row[0] for row in cur.fetchall()]
    return [(instant - instants[0]).total_seconds() for instant in instants]


def server_version() -> str:
    return str(scalar(None, "SHOW server_version" if POSTGRESQL else "SELECT VERSION()"))


def server_process(cmd: str) -> str | None:
    """For the load monitor: how a process of the database server counts, by its
    command line. On PostgreSQL a backend of a scratch database is the benchmark's
    ("ours"), another client's backend "foreign", the server's own processes "pg_aux".
    MariaDB serves every client from threads of one process, which cannot be told
    apart from here: all of it is "db_server". None: not a server process."""
    if POSTGRESQL:
        if not cmd.startswith("postgres:"):
            return None
        if DB_PREFIX in cmd:
            return "ours"
        return "foreign" if ("(" in cmd or "[local]" in cmd) else "pg_aux"
    name = os.path.basename(cmd.split(" ", 1)[0])
    return "db_server" if name in ("mariadbd", "mysqld") else None
