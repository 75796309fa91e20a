"""Build the sdist and the wheel, install the wheel in a clean venv, run the demo from it.

No editable install and no checkout on ``sys.path``: the demo imports
``django_jobs`` from the installed wheel (the test checks where from), and uses a
scratch database on the suite's PostgreSQL server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.helpers import on_server

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST = PROJECT["name"].replace("-", "_")

pytestmark = pytest.mark.process
# The suite's own settings and test database are not the demo's.
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON", "VIRTUAL_ENV"))
}


def run(command: list[str], *, cwd: Path, timeout: float, **env: str) -> str:
    result = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**CLEAN_ENV, **env},
        check=False,
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel built from this checkout (the wheel built from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out, timeout=600)
    return {"sdist": next(out.glob("*.tar.gz")), "wheel": next(out.glob("*.whl"))}


@pytest.fixture
def scratch_database() -> Iterator[str]:
    """A fresh database on the suite's server; its URL, dropped at the end."""
    url = urlsplit(os.environ["DATABASE_URL"])  # tests/settings.py exports it
    name = f"wheel_demo_{uuid.uuid4().hex[:12]}"
    on_server(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(url._replace(path=f"/{name}"))
    finally:
        on_server(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_distributions_hold_the_package_and_the_license(dists: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    assert "django_jobs/py.typed" in names
    assert any(n.startswith("django_jobs/migrations/0001_") for n in names)
    assert any(n.startswith("django_jobs/templates/admin/") for n in names)
    # The admin's French catalog, compiled: Django reads the .mo, not the .po.
    assert "django_jobs/locale/fr/LC_MESSAGES/django.mo" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "example_project/", "bench/")) for n in names)
    metadata = zipfile.ZipFile(dists["wheel"]).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))
    )
    assert f"Name: {PROJECT['name']}\n".encode() in metadata
    assert b"License-Expression: MIT\n" in metadata
    # psycopg asks libraries for plain psycopg; the implementation is the application's.
    assert b'Requires-Dist: psycopg>=3.2; extra == "postgres"\n' in metadata
    with tarfile.open(dists["sdist"]) as sdist_file:
        sdist = sdist_file.getnames()
    assert any(n.endswith("/LICENSE") for n in sdist)
    assert any(n.endswith("/django_jobs/locale/fr/LC_MESSAGES/django.po") for n in sdist)
    assert any(n.endswith("/django_jobs/locale/fr/LC_MESSAGES/django.mo") for n in sdist)
    assert dists["wheel"].name.startswith(f"{DIST}-")


def test_the_demo_runs_from_the_installed_wheel(
    dists: dict[str, Path], scratch_database: str, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, timeout=120)
    python = str(venv / "bin" / "python")
    mysql = scratch_database.startswith(("mysql", "mariadb"))
    extra = "mysql" if mysql else "postgres"
    requirement = f"{PROJECT['name']}[{extra}] @ {dists['wheel'].as_uri()}"
    driver = [] if mysql else ["psycopg[binary]"]
    run(
        [python, "-m", "pip", "install", "-q", requirement, *driver, "django-environ"],
        cwd=tmp_path,
        timeout=600,
    )
    where = run(
        [python, "-c", "import django_jobs; print(django_jobs.__file__)"], cwd=tmp_path, timeout=60
    )
    assert where.startswith(str(venv)), where
    # The example project is copied out of the checkout: nothing of it is importable there.
    example = tmp_path / "example_project"
    run(["cp", "-r", str(ROOT / "example_project"), str(example)], cwd=tmp_path, timeout=60)
    output = run(
        [python, str(example / "manage.py"), "rundemo", "--runs", "40"],
        cwd=tmp_path,
        timeout=300,
        DATABASE_URL=scratch_database,
    )
    assert "40/40" in output
    assert "completed    40" in output.replace("\t", " ")
