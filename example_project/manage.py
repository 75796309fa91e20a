#!/usr/bin/env python
"""Django's command-line utility for the django_jobs example project."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    # Run as ``python example_project/manage.py`` from anywhere: the project's own
    # packages (example_site, shop) live beside this file.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
