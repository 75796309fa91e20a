"""Fetch the tests of Django's tasks framework (``tests/tasks/``) from Django's sdist.

They ship in Django's source distribution, not in its wheel: pip downloads the
sdist of the installed version once into ``~/.cache/django-jobs/`` (or
``$XDG_CACHE_HOME``), and only ``tests/tasks/`` is unpacked from it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import django


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "django-jobs" / f"django-{django.__version__}"


def django_tests_dir() -> Path:
    """The unpacked ``tests/`` directory holding Django's ``tasks`` test package."""
    target = cache_dir() / "tests"
    if (target / "tasks" / "test_tasks.py").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # On the cache's own file system, so that the final rename is atomic.
    with tempfile.TemporaryDirectory(dir=target.parent) as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                download,
                f"Django=={django.__version__}",
            ],
            check=True,
        )
        (sdist,) = Path(download).glob("*.tar.gz")
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if "/tests/tasks/" in m.name and m.isfile()]
            if not members:
                raise RuntimeError(f"{sdist.name} has no tests/tasks/")
            staging = Path(download) / "unpacked"
            archive.extractall(staging, members=members, filter="data")
        (source,) = staging.glob("*/tests")
        # Moved into place whole, so an interrupted fetch leaves no half directory.
        if not target.exists():
            source.rename(target)
    return target
