"""Build the documentation site with warnings as errors, and keep its references complete."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Options every Django command has; docs/commands.md does not repeat them.
DJANGO_OPTIONS = frozenset(
    {
        "-h",
        "--help",
        "--version",
        "-v",
        "--verbosity",
        "--settings",
        "--pythonpath",
        "--traceback",
        "--no-color",
        "--force-color",
        "--skip-checks",
    }
)


def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    result = subprocess.run(
        [*command, "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "html" / "index.html").exists()
    assert (tmp_path / "html" / "api.html").read_text().count('class="sig-name') >= 10


def options_of(name: str) -> set[str]:
    """The option strings and sub-actions of django_jobs' command ``name``, Django's excepted."""
    parser = load_command_class("django_jobs", name).create_parser("manage.py", name)
    found: set[str] = set()
    actions = list(parser._actions)
    while actions:
        action = actions.pop()
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for choice, subparser in action.choices.items():
                found.add(choice)
                actions.extend(subparser._actions)
    return found - DJANGO_OPTIONS


@pytest.mark.parametrize(
    "name", sorted(name for name, app in get_commands().items() if app == "django_jobs")
)
def test_every_command_and_option_is_documented(name: str) -> None:
    page = (DOCS / "commands.md").read_text()
    assert f"## `{name}`" in page, f"docs/commands.md has no section for {name}"
    section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
    missing = sorted(option for option in options_of(name) if f"`{option}" not in section)
    assert missing == [], f"docs/commands.md does not describe {name} {missing}"


def test_every_system_check_is_documented() -> None:
    source = "\n".join(path.read_text() for path in (ROOT / "django_jobs").rglob("*.py"))
    # Ids are written whole ("django_jobs.E001") or as codes ("E009") put together later.
    codes = set(re.findall(r"(?:(?<=\")|(?<=django_jobs\.))([EW]\d{3})(?=\")", source))
    assert len(codes) >= 9
    page = (DOCS / "checks.md").read_text()
    assert sorted(c for c in codes if f"`django_jobs.{c}`" not in page) == []


def test_the_readme_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    pages = {path.name for path in DOCS.glob("*.md")} - {"index.md"}
    assert pages, "no pages found"
    missing = sorted(page for page in pages if f"(docs/{page})" not in readme)
    assert missing == []
