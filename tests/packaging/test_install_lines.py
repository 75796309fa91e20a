"""The install lines of the README, the docs and the code's hints name the distribution we build."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = PYPROJECT["name"]
EXTRAS = set(PYPROJECT["optional-dependencies"])
# Where a person reads an install line: the README, the docs, the example
# project, and the hints in the code's error messages.
SOURCES = [
    ROOT / "README.md",
    ROOT / "example_project" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "django_jobs").rglob("*.py")),
]
PIP_INSTALL = re.compile(r"pip install ([^`\n]+)")


def requirements(text: str) -> list[Requirement]:
    """The requirements named by every ``pip install`` line of ``text``."""
    found = []
    for line in PIP_INSTALL.findall(text):
        # Stop at the end of the command (a shell operator, a closing quote of the prose).
        command = re.split(r"&&|\|\||;", line)[0]
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        for word in words:
            if word.startswith(("-", ".")) or "/" in word:
                continue  # an option, or this checkout
            try:
                found.append(Requirement(word.strip("\"'`")))
            except InvalidRequirement:
                continue
    return found


def install_lines() -> list[tuple[str, Requirement]]:
    return [
        (str(path.relative_to(ROOT)), requirement)
        for path in SOURCES
        for requirement in requirements(path.read_text())
    ]


def test_the_distribution_is_not_the_unrelated_django_jobs() -> None:
    # django-jobs on PyPI is "A job board for Python" (2010).
    assert NAME == "django-durable-jobs"


def test_install_lines_name_the_distribution_built_here() -> None:
    lines = install_lines()
    ours = [(where, req) for where, req in lines if req.extras & EXTRAS or req.name == NAME]
    assert {"README.md", "docs/installation.md", "docs/tutorial.md"} <= {w for w, _ in ours}
    wrong = [(where, str(req)) for where, req in ours if req.name != NAME]
    assert wrong == []
    unknown = [(where, str(req)) for where, req in ours if not req.extras <= EXTRAS]
    assert unknown == []


def test_no_install_line_names_the_job_board() -> None:
    assert [(w, str(r)) for w, r in install_lines() if r.name == "django-jobs"] == []


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("pip install 'django-jobs[postgres]'", ["django-jobs"]),
        ('`pip install "x-y[metrics]"`', ["x-y"]),
        ("pip install -e '.[demo]' && .venv/bin/python manage.py", []),
        ("pip install 'a[postgres]' 'psycopg[binary]'", ["a", "psycopg"]),
    ],
)
def test_install_lines_are_read(text: str, names: list[str]) -> None:
    assert [r.name for r in requirements(text)] == names
