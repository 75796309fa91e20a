"""Sphinx configuration of the django_jobs documentation (built with ``-W``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# autodoc imports django_jobs' modules, and its models need a configured Django.
# No database is touched: the settings name none.
os.environ.pop("DJANGO_SETTINGS_MODULE", None)
if not settings.configured:
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_jobs"],
        DATABASES={},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
django.setup()

project = "django_jobs"
author = "django_jobs developers"
copyright = "django_jobs developers"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

# Links such as ``children.md#close-policies`` resolve to the headings' slugs.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Unlabelled fences are shell commands or output: do not highlight them as Python.
highlight_language = "none"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = "django_jobs"
